package docstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// quickStartBlocks returns the ```sh blocks of README.md between the
// quickstart markers, in order.
func quickStartBlocks(readme string) ([]string, error) {
	_, rest, ok := strings.Cut(readme, "<!-- quickstart:begin -->")
	if !ok {
		return nil, errors.New("README.md has no <!-- quickstart:begin --> marker")
	}
	section, _, ok := strings.Cut(rest, "<!-- quickstart:end -->")
	if !ok {
		return nil, errors.New("README.md has no <!-- quickstart:end --> marker")
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?ms)^```sh\n(.*?)^```\\s*$").FindAllStringSubmatch(section, -1) {
		blocks = append(blocks, m[1])
	}
	if len(blocks) == 0 {
		return nil, errors.New("the quick start has no ```sh block")
	}
	return blocks, nil
}

// freeAddr is a loopback address nothing listens on now, so the emulator
// and the consumer's metrics never meet another test's (or a person's).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestQuickStart runs README's quick start as written: its shell blocks,
// in order, in one bash with -euo pipefail, from the repository's root
// (the blocks build into bin/ there, as they tell a reader to). Only the
// names are its own: a fresh Postgres schema, a fresh stream and a free
// port for the emulator, through the variables the quick start reads with
// defaults. It counts what matters: one ledger row, charged, with a
// charge id; one charge scanned by an audit that exits 0 with no finding;
// one usage event recorded delivered in the meter ledger and counted once
// (3 units) by the meter the quick start created at the emulator, with no
// dead letter and no refusal in the meter consumer's log.
func TestQuickStart(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the quick start builds three binaries")
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	root := repoRoot(t)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := quickStartBlocks(string(readme))
	if err != nil {
		t.Fatal(err)
	}

	schema := "qs_" + testenv.Suffix()
	stream := testenv.Name(t, "quickstart")
	usage := testenv.Name(t, "quickstart-usage")
	tmp := t.TempDir()
	env := append(os.Environ(),
		"REDIS_URL="+testenv.RedisURL(),
		"DATABASE_URL="+testenv.DatabaseURL(),
		"PELGUARD_DB_SCHEMA="+schema,
		"PELGUARD_STREAM="+stream,
		"USAGE_STREAM="+usage,
		"STRIPESIM_ADDR="+freeAddr(t),
		"PELGUARD_METRICS_ADDR="+freeAddr(t),
		"TMPDIR="+tmp,
	)
	testenv.CleanupKeys(t, testenv.Redis(t), stream, stream+":dead", usage, usage+":dead")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if conn, err := pgx.Connect(ctx, testenv.DatabaseURL()); err == nil {
			_, _ = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
			_ = conn.Close(ctx)
		}
	})

	script := "set -euo pipefail\n" + strings.Join(blocks, "\n")
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = root
	cmd.Env = env
	// Its own process group, so whatever the script left running (the
	// emulator, the consumer) is stopped with it, even when a step fails.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out testenv.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err = cmd.Run()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	elapsed := time.Since(start)
	logs := out.String()
	for _, f := range []string{"consumer.log", "meter-events.log", "stripesim.log"} {
		if b, err := os.ReadFile(filepath.Join(root, "bin", f)); err == nil {
			logs += "\n--- bin/" + f + "\n" + string(b)
		}
	}
	if err != nil {
		t.Fatalf("the quick start failed after %s: %v\n%s", elapsed.Round(time.Second), err, logs)
	}
	t.Logf("the quick start ran in %s", elapsed.Round(time.Second))

	conn, err := pgx.Connect(ctx, testenv.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var rows, charged int
	var chargeID string
	q := fmt.Sprintf(`SELECT count(*), count(*) FILTER (WHERE status = 'charged' AND amount_cents = 2500),
		coalesce(max(charge_id), '') FROM %s.billing_records`, pgx.Identifier{schema}.Sanitize())
	if err := conn.QueryRow(ctx, q).Scan(&rows, &charged, &chargeID); err != nil {
		t.Fatalf("reading the ledger: %v\n%s", err, logs)
	}
	if rows != 1 || charged != 1 || !strings.HasPrefix(chargeID, "ch_") {
		t.Errorf("ledger: %d rows, %d charged 2500 cents, charge %q; want 1 charged row with a charge id\n%s", rows, charged, chargeID, logs)
	}
	var findings int
	q = fmt.Sprintf(`SELECT count(*) FROM %s.audit_findings`, pgx.Identifier{schema}.Sanitize())
	if err := conn.QueryRow(ctx, q).Scan(&findings); err != nil {
		t.Fatalf("reading the findings: %v", err)
	}
	if findings != 0 {
		t.Errorf("%d audit findings, want 0\n%s", findings, logs)
	}
	// The audit saw the charge: a run that scanned nothing is clean too.
	if !strings.Contains(out.String(), "scanned 1 charges") || !strings.Contains(out.String(), "findings: 0 detected") {
		t.Errorf("the audit did not report one charge scanned and no finding:\n%s", out.String())
	}

	// The meter step: one usage event, delivered once, counted 3 by Stripe.
	var meterRows, delivered int
	q = fmt.Sprintf(`SELECT count(*), count(*) FILTER (WHERE status = 'delivered' AND value = 3 AND event_name = 'api_requests'
		AND stripe_customer_id = 'cus_ABC') FROM %s.meter_events`, pgx.Identifier{schema}.Sanitize())
	if err := conn.QueryRow(ctx, q).Scan(&meterRows, &delivered); err != nil {
		t.Fatalf("reading the meter ledger: %v\n%s", err, logs)
	}
	if meterRows != 1 || delivered != 1 {
		t.Errorf("meter ledger: %d rows, %d delivered of 3 units; want the one usage event delivered\n%s", meterRows, delivered, logs)
	}
	if !strings.Contains(out.String(), `"total":3`) {
		t.Errorf("the emulator's count for cus_ABC is not 3 units:\n%s", out.String())
	}
	if n, err := testenv.Redis(t).XLen(ctx, usage+":dead").Result(); err != nil || n != 0 {
		t.Errorf("%d usage events dead-lettered (%v), want none\n%s", n, err, logs)
	}
	if strings.Contains(logs, "meter_event_refused") || strings.Contains(logs, "no Stripe meter") {
		t.Errorf("the meter consumer saw a refusal: the meter step did not create the meter first\n%s", logs)
	}
}
