package audit

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

// usageBenchRate is the auditor's bound on summary requests under Stripe's
// live limits with no billing running: 100/s for the account, of which one
// endpoint (GET /v1/billing/meters/{id}/event_summaries) gets 25/s
// (documented default per endpoint). Under full billing the auditor's floor
// is 5 % of 100/s: the bound is then requests / 5 s.
const usageBenchRate = 25.0

// BenchmarkUsageProcess measures the usage reconciliation as it runs in
// production: `pelguard-auditor usage`, built and run in a process of its
// own, against the emulator in another (cmd/stripesim, limited to the live
// 100 requests/s), the fleet's limiter in Redis (--stripe-rate 100,
// --stripe-endpoint-rate 25), over PELGUARD_USAGE_BENCH_EVENTS delivered
// events (default 200,000) of PELGUARD_USAGE_BENCH_CUSTOMERS customers
// (default 200) over 30 days, which the emulator's summaries match. It
// reports the wall time against the limiter's bound (summary requests ÷
// 25/s; x-bound, goal ≤ 1.1) and the auditor's peak RSS (the child's VmHWM,
// polled: see watchHWM; goal ≤ 150 MB). The size:
//
//	PELGUARD_USAGE_BENCH_EVENTS=10000000 PELGUARD_USAGE_BENCH_CUSTOMERS=10000 \
//	  go test -run '^$' -bench UsageProcess -benchtime 1x -timeout 90m ./audit/
func BenchmarkUsageProcess(b *testing.B) {
	events := benchEnvInt(b, "PELGUARD_USAGE_BENCH_EVENTS", 200_000)
	customers := benchEnvInt(b, "PELGUARD_USAGE_BENCH_CUSTOMERS", 200)
	// PELGUARD_USAGE_BENCH_RATE raises the endpoint's rate (and the
	// emulator's) to look at the auditor's own costs quickly.
	rate := float64(benchEnvInt(b, "PELGUARD_USAGE_BENCH_RATE", int(usageBenchRate)))
	dir := b.TempDir()
	bin := goBuild(b, dir, "auditor")
	simURL := startSimProcess(b, goBuild(b, dir, "stripesim"))
	simPost(b, simURL+"/_sim/faults", map[string]any{"rate_limit": max(100, 4*rate)})
	sc, err := stripeapi.New(stripeapi.Config{APIKey: testKey, BaseURL: simURL})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := sc.CreateMeter(context.Background(), stripeapi.MeterSpec{EventName: "api_calls"}); err != nil {
		b.Fatal(err)
	}
	pool, dbURL := testenv.DBWithURL(b)
	schema := testenv.SchemaOf(pool)
	start := time.Now()
	seedUsageBench(b, pool, schema, simURL, events, customers, start)
	b.Logf("seeded %d delivered events of %d customers over 30 days (and the emulator's matching usage) in %s",
		events, customers, time.Since(start).Round(time.Millisecond))

	args := []string{"usage", "--json", "--database-url", dbURL, "--db-schema", schema, "--stripe-api-base", simURL,
		"--wait-for-deps", "0s", "--stripe-rate", strconv.Itoa(int(max(100, 4*rate))), "--stripe-endpoint-rate", strconv.Itoa(int(rate)),
		"--stripe-account", "usage-bench-" + schema, "--parallel", "8",
		"--log-level", cmp.Or(os.Getenv("PELGUARD_BENCH_LOG_LEVEL"), "warn")}
	if u := os.Getenv("REDIS_URL"); u != "" {
		args = append(args, "--redis-url", u)
	} else {
		args = append(args, "--stripe-fallback-rate", strconv.Itoa(int(rate)))
	}
	b.ResetTimer()
	b.Run(fmt.Sprintf("events=%d/customers=%d", events, customers), func(b *testing.B) {
		for range b.N {
			cmd := exec.Command(bin, args...)
			cmd.Env = append(os.Environ(), "STRIPE_API_KEY="+testKey)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			t0 := time.Now()
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			hwm := watchHWM(cmd.Process.Pid)
			err := cmd.Wait()
			wall := time.Since(t0)
			peak := hwm()
			if err != nil {
				b.Fatalf("auditor usage: %v\n%s", err, stderr.String())
			}
			if os.Getenv("PELGUARD_BENCH_LOG_LEVEL") != "" {
				// Whole, in a file: b.Logf truncates long output.
				path := filepath.Join(os.TempDir(), "usage-bench-auditor.log")
				if err := os.WriteFile(path, stderr.Bytes(), 0o600); err != nil {
					b.Fatal(err)
				}
				b.Logf("auditor stderr: %s", path)
			}
			var rep UsageReport
			if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
				b.Fatalf("auditor usage --json: %v", err)
			}
			if rep.Customers != int64(customers) || rep.OpenFindings != 0 || rep.Suspect != 0 {
				b.Fatalf("compared %d customers, %d open findings, %d suspect; want %d, 0, 0", rep.Customers, rep.OpenFindings, rep.Suspect, customers)
			}
			bound := float64(rep.Requests) / rate
			b.ReportMetric(float64(rep.Requests), "requests")
			b.ReportMetric(float64(rep.WindowsCompared), "windows")
			b.ReportMetric(wall.Seconds(), "wall-s")
			b.ReportMetric(bound, "bound-s")
			b.ReportMetric(wall.Seconds()/bound, "x-bound")
			b.ReportMetric(float64(peak)/1024, "peak-rss-MB")
		}
	})
}

// watchHWM polls the VmHWM (peak RSS) of process pid until the returned
// function is called after the process ended, and returns the last value
// read, in KiB. Not getrusage's ru_maxrss: Go starts a child with
// CLONE_VM, and Linux carries the parent's peak RSS into the child's at
// exec, so ru_maxrss would report the benchmark's own seeding memory.
// VmHWM belongs to the auditor's own address space and only grows.
func watchHWM(pid int) func() int64 {
	var last atomic.Int64
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		path := fmt.Sprintf("/proc/%d/status", pid)
		for {
			if raw, err := os.ReadFile(path); err == nil {
				for _, line := range strings.Split(string(raw), "\n") {
					if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
						if v, err := strconv.ParseInt(f[1], 10, 64); err == nil && v > last.Load() {
							last.Store(v)
						}
					}
				}
			}
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() int64 {
		close(done)
		<-stopped
		return last.Load()
	}
}

func benchEnvInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}

func simPost(b *testing.B, url string, v any) {
	b.Helper()
	body, err := json.Marshal(v)
	if err != nil {
		b.Fatal(err)
	}
	resp, err := http.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("POST %s: status %d", url, resp.StatusCode)
	}
}

// seedUsageBench COPYs n delivered events of customers over the 30 days
// before now (minus 2 hours, so every window has settled) into
// meter_events, and gives the emulator the same usage aggregated per
// customer and UTC day before the last three days and per hour within
// them: the summaries the auditor reads are those of the events.
func seedUsageBench(b *testing.B, pool *pgxpool.Pool, schema, simURL string, n, customers int, now time.Time) {
	b.Helper()
	ctx := context.Background()
	ml, err := meterledger.New(pool, meterledger.Config{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := ml.EnsurePartitions(ctx, now); err != nil {
		b.Fatal(err)
	}
	from, to := now.Add(-30*24*time.Hour+time.Hour), now.Add(-2*time.Hour)
	span := to.Sub(from)
	cut := now.Truncate(24 * time.Hour).Add(-3 * 24 * time.Hour)
	type bucket struct {
		cust int
		at   int64
	}
	agg := map[bucket]int64{}
	i := 0
	rows := pgx.CopyFromFunc(func() ([]any, error) {
		if i == n {
			return nil, nil
		}
		cust := i % customers
		ts := from.Add(time.Duration(float64(span) * float64(i) / float64(n))).Truncate(time.Millisecond)
		value := int64(1 + i%7)
		bt := ts.Truncate(time.Hour)
		if ts.Before(cut) {
			bt = ts.Truncate(24 * time.Hour)
		}
		agg[bucket{cust, bt.Unix()}] += value
		row := []any{ts, fmt.Sprintf("pg_bench_%09d", i), "api_calls", fmt.Sprintf("cus_%06d", cust), value, "delivered",
			ts, 1, int64(1), ts, ts}
		i++
		return row, nil
	})
	if _, err := pool.CopyFrom(ctx, pgx.Identifier{schema, "meter_events"}, []string{"event_ts", "identifier", "event_name",
		"stripe_customer_id", "value", "status", "first_sent_at", "attempts", "epoch", "delivered_at", "created_at"}, rows); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "ANALYZE "+schema+".meter_events"); err != nil {
		b.Fatal(err)
	}
	batch := make([]stripesim.MeterEventSeed, 0, 50_000)
	flush := func() {
		if len(batch) > 0 {
			simPost(b, simURL+"/_sim/meter_seed", batch)
			batch = batch[:0]
		}
	}
	for k, v := range agg {
		batch = append(batch, stripesim.MeterEventSeed{EventName: "api_calls", Customer: fmt.Sprintf("cus_%06d", k.cust), Value: v, Timestamp: k.at})
		if len(batch) == cap(batch) {
			flush()
		}
	}
	flush()
	if strings.Contains(os.Getenv("PELGUARD_BENCH_LOG_LEVEL"), "debug") {
		b.Logf("%d emulator usage events", len(agg))
	}
}
