package audit

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

// BenchmarkAuditProcess measures the auditor as it runs in production: the
// built binary in a process of its own, against the emulator in another
// (cmd/stripesim, so the emulator's memory is not counted), over a window of
// PELGUARD_BENCH_ROWS ledger rows (default 100,000), their charges and 1 %
// second charges, emulator latency 0. It reports the wall time of `auditor
// run` and the peak RSS of the auditor process (its VmHWM, watchHWM: not
// ru_maxrss, which carries the benchmark's own peak into the child).
//
// PELGUARD_AUDITOR_BINS lists the binaries to compare, name=path[,name=path]
// (for example before=/tmp/auditor-main,after=/tmp/auditor-branch), each run
// b.N times over the same seed; without it the package's own cmd/auditor is
// built. PELGUARD_BENCH_ARGS adds flags to `auditor run`;
// PELGUARD_BENCH_LOG_LEVEL=debug logs each run's phases. Goal for 1,000,000 rows: ≤ 60 s and ≤ 150 MB.
//
//	PELGUARD_BENCH_ROWS=1000000 go test -run '^$' -bench AuditProcess -benchtime 1x -timeout 60m ./audit/
func BenchmarkAuditProcess(b *testing.B) {
	rows := 100_000
	if v := os.Getenv("PELGUARD_BENCH_ROWS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 100 {
			b.Fatalf("PELGUARD_BENCH_ROWS=%q: want a number ≥ 100", v)
		}
		rows = n
	}
	dir := b.TempDir()
	bins := map[string]string{}
	var order []string
	if v := os.Getenv("PELGUARD_AUDITOR_BINS"); v != "" {
		for _, kv := range strings.Split(v, ",") {
			name, path, ok := strings.Cut(kv, "=")
			if !ok {
				b.Fatalf("PELGUARD_AUDITOR_BINS: %q is not name=path", kv)
			}
			bins[name] = path
			order = append(order, name)
		}
	} else {
		bins["auditor"] = goBuild(b, dir, "auditor")
		order = append(order, "auditor")
	}
	simURL := startSimProcess(b, goBuild(b, dir, "stripesim"))
	pool, dbURL := testenv.DBWithURL(b)
	schema := testenv.SchemaOf(pool)
	l := ledger.New(pool, schema, clock.NewSim(now))

	start := time.Now()
	dups := seedProcessBench(b, simURL, l, rows)
	// A ledger that has lived has statistics; one just filled by COPY has none.
	if _, err := pool.Exec(context.Background(), "ANALYZE "+schema+".billing_records"); err != nil {
		b.Fatal(err)
	}
	b.Logf("seeded %d ledger rows, %d charges in %s", rows, rows+dups, time.Since(start).Round(time.Millisecond))

	b.ResetTimer()
	for _, name := range order {
		b.Run(fmt.Sprintf("%s/rows=%d", name, rows), func(b *testing.B) {
			for range b.N {
				wall, rss, rep := runAuditorProcess(b, bins[name], dbURL, schema, simURL)
				if got := len(byKind(rep.Findings)[KindDuplicate]); got != dups || len(rep.Findings) != dups {
					b.Fatalf("%d duplicates, %d findings; want %d", got, len(rep.Findings), dups)
				}
				b.ReportMetric(float64(rep.ChargesScanned), "charges")
				b.ReportMetric(wall.Seconds(), "wall-s")
				b.ReportMetric(float64(rss)/(1<<20), "peak-rss-MB")
			}
		})
	}
}

// goBuild builds ./cmd/<name> into dir.
func goBuild(b *testing.B, dir, name string) string {
	b.Helper()
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", out, "../cmd/"+name)
	if msg, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("building %s: %v\n%s", name, err, msg)
	}
	return out
}

// startSimProcess starts the emulator binary on a free port and waits until
// it answers.
func startSimProcess(b *testing.B, bin string) string {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin, "-addr", addr)
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	url := "http://" + addr
	for deadline := time.Now().Add(30 * time.Second); ; {
		resp, err := http.Get(url + "/_sim/faults")
		if err == nil {
			resp.Body.Close()
			return url
		}
		if time.Now().After(deadline) {
			b.Fatalf("the emulator at %s does not answer: %v", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// seedProcessBench seeds n charged ledger rows over [w0, w1) and their
// charges in the emulator process (POST /_sim/seed, 10,000 a request),
// plus a second charge for every 100th customer half an hour later. It
// returns the number of second charges.
func seedProcessBench(b *testing.B, simURL string, l *ledger.Ledger, n int) int {
	b.Helper()
	ctx := context.Background()
	span := w1.Sub(w0) - time.Hour
	const chunk = 10_000
	dups := 0
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		seeds := make([]stripesim.SeedJSON, 0, hi-lo+chunk/100)
		for i := lo; i < hi; i++ {
			cust := fmt.Sprintf("c%07d", i)
			at := spreadAt(w0, span, i, n)
			seeds = append(seeds, stripesim.SeedJSON{Customer: "cus_" + cust, Amount: 2500, Created: at.Unix(),
				Metadata: stripeapi.PelguardMetadata(cust, testPeriod, key(cust))})
		}
		ids := simSeed(b, simURL, seeds)
		recs := make([]ledger.Record, 0, hi-lo)
		var second []stripesim.SeedJSON
		for i := lo; i < hi; i++ {
			s := seeds[i-lo]
			at := time.Unix(s.Created, 0)
			recs = append(recs, row(strings.TrimPrefix(s.Customer, "cus_"), 2500, ids[i-lo], at.Add(time.Second)))
			if i%100 == 0 {
				s.Created = at.Add(30 * time.Minute).Unix()
				second = append(second, s)
			}
		}
		dups += len(simSeed(b, simURL, second))
		if _, err := l.SeedForTest(ctx, recs); err != nil {
			b.Fatal(err)
		}
	}
	return dups
}

func simSeed(b *testing.B, simURL string, seeds []stripesim.SeedJSON) []string {
	b.Helper()
	if len(seeds) == 0 {
		return nil
	}
	body, err := json.Marshal(seeds)
	if err != nil {
		b.Fatal(err)
	}
	resp, err := http.Post(simURL+"/_sim/seed", "application/json", bytes.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		IDs []string `json:"ids"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK || len(out.IDs) != len(seeds) {
		b.Fatalf("seeding %d charges: status %d, %d ids, %v", len(seeds), resp.StatusCode, len(out.IDs), err)
	}
	return out.IDs
}

// runAuditorProcess runs `auditor run` over [w0, w1) and returns its wall
// time, its peak RSS in bytes and its JSON report.
func runAuditorProcess(b *testing.B, bin, dbURL, schema, simURL string) (time.Duration, int64, Report) {
	b.Helper()
	args := []string{"run", "--json", "--from", w0.Format(time.RFC3339), "--to", w1.Format(time.RFC3339),
		"--database-url", dbURL, "--db-schema", schema, "--stripe-api-base", simURL, "--wait-for-deps", "0s",
		"--log-level", cmp.Or(os.Getenv("PELGUARD_BENCH_LOG_LEVEL"), "warn")}
	// PELGUARD_BENCH_ARGS adds flags (e.g. "--parallel 8").
	cmd := exec.Command(bin, append(args, strings.Fields(os.Getenv("PELGUARD_BENCH_ARGS"))...)...)
	cmd.Env = append(os.Environ(), "STRIPE_API_KEY="+testKey)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatalf("starting the auditor: %v", err)
	}
	peak := watchHWM(cmd.Process.Pid)
	err := cmd.Wait()
	wall := time.Since(start)
	peakKiB := peak()
	// Exit 1 is "open findings", which the seed has.
	if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 1 {
		b.Fatalf("auditor run: %v (want exit 1: open findings)\n%s", err, stderr.String())
	}
	ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		b.Fatal("no rusage for the auditor process")
	}
	var rep Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		b.Fatalf("auditor --json: %v", err)
	}
	if os.Getenv("PELGUARD_BENCH_LOG_LEVEL") != "" {
		b.Logf("auditor stderr:\n%s", stderr.String())
	}
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	b.ReportMetric(cpu.Seconds(), "cpu-s")
	return wall, peakKiB * 1024, rep
}
