package auditorcli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

func call(args ...string) (int, string, string) {
	// Safe for concurrent writes: go-redis's logger is process-wide
	// (cli.RouteLibraryLogs), so a background dial of another parallel
	// test's command may write here too.
	var out, errb testenv.SyncBuffer
	code := Main(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestBadFlagsExit2(t *testing.T) {
	t.Parallel()
	cases := map[string][]string{
		"unknown flag":       {"--bogus"},
		"unknown command":    {"frobnicate"},
		"bad --from":         {"--from", "yesterday", "--stripe-key", "sk_test_x"},
		"refund without id":  {"refund", "--stripe-key", "sk_test_x"},
		"refund id and all":  {"refund", "3", "--all", "--stripe-key", "sk_test_x"},
		"bad finding id":     {"resolve", "abc"},
		"bad kind":           {"findings", "--kind", "nope"},
		"schedule with from": {"--schedule", "@hourly", "--from", "2026-11-01", "--stripe-key", "sk_test_x"},
		"no stripe key":      {"--stripe-key", "", "--database-url", "postgres://127.0.0.1:1/x"},
		"bad log level":      {"findings", "--log-level", "loud"},
		"zero rolling cap":   {"refund", "--all", "--max-refunds-24h", "0", "--stripe-key", "sk_test_x"},
	}
	for name, args := range cases {
		code, _, stderr := call(args...)
		if code != 2 || !strings.Contains(stderr, "auditor") {
			t.Errorf("%s: exit %d, stderr %q", name, code, stderr)
		}
	}
}

// Postgres that does not answer is ExitUnavailable (3), without the
// password; it used to be 2, the code for a wrong configuration. Stripe
// failing during the run is a failed run: 2.
func TestUnreachableDependencies(t *testing.T) {
	t.Parallel()
	code, _, stderr := call("--database-url", "postgres://auditor:s3cretpw@127.0.0.1:1/x?sslmode=disable", "--stripe-key", "sk_test_x",
		"--wait-for-deps", "0")
	if code != cli.ExitUnavailable || !strings.Contains(stderr, "Postgres") || strings.Contains(stderr, "s3cretpw") {
		t.Fatalf("unreachable Postgres: exit %d, %q", code, stderr)
	}
	_, url := testenv.DBWithURL(t)
	code, _, stderr = call("--database-url", url, "--db-schema", testenv.SchemaOfURL(url), "--stripe-key", "sk_test_abcdefgh12345", "--stripe-api-base", "http://127.0.0.1:1",
		"--stripe-retries", "0", "--from", "2026-11-01", "--to", "2026-11-02")
	if code != 2 || !strings.Contains(stderr, "listing") || strings.Contains(stderr, "sk_test_abcdefgh12345") {
		t.Fatalf("unreachable Stripe: exit %d, %q", code, stderr)
	}
}

func TestAuditRefundResolveEndToEnd(t *testing.T) {
	t.Parallel()
	pool, url := testenv.DBWithURL(t)
	sim := stripesim.MustNew(stripesim.Config{})
	t.Cleanup(sim.Close)
	at := time.Now().Add(-2 * time.Hour).Truncate(time.Second)
	md := stripeapi.PelguardMetadata("c1", "2026-11", "k1")
	canon := sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_1", Amount: 2500, Created: at, Metadata: md}).ID
	dup := sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_1", Amount: 2500, Created: at.Add(time.Minute), Metadata: md}).ID
	orphan := sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_2", Amount: 900, Created: at,
		Metadata: stripeapi.PelguardMetadata("c2", "2026-11", "k2")}).ID
	l := ledger.New(pool, testenv.SchemaOf(pool), clock.NewSim(at))
	if _, err := l.SeedForTest(context.Background(), []ledger.Record{{Key: ledger.Key{CustomerID: "c1", BillingPeriod: "2026-11"},
		StripeCustomerID: "cus_1", AmountCents: 2500, IdempotencyKey: "k1", ChargeID: canon, ChargedAt: at.Add(time.Second)}}); err != nil {
		t.Fatal(err)
	}
	base := []string{"--database-url", url, "--db-schema", testenv.SchemaOfURL(url), "--stripe-key", "sk_test_x", "--stripe-api-base", sim.URL()}
	window := []string{"--from", at.Add(-time.Hour).Format(time.RFC3339), "--to", at.Add(time.Hour).Format(time.RFC3339)}

	code, out, stderr := call(append(append([]string{"run", "--json"}, base...), window...)...)
	if code != 1 {
		t.Fatalf("audit: exit %d, %s", code, stderr)
	}
	var rep struct {
		Findings []struct {
			ID      int64  `json:"id"`
			Kind    string `json:"kind"`
			Subject string `json:"subject"`
		} `json:"findings"`
		NewFindings int `json:"new_findings"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Findings) != 2 || rep.NewFindings != 2 {
		t.Fatalf("report %s (%v)", out, err)
	}
	ids := map[string]int64{}
	for _, f := range rep.Findings {
		ids[f.Kind+":"+f.Subject] = f.ID
	}
	dupID, orphanID := ids["duplicate_charge:"+dup], ids["orphan_charge:"+orphan]
	if dupID == 0 || orphanID == 0 {
		t.Fatalf("findings %+v", rep.Findings)
	}

	// The table lists them; the dry run refunds nothing.
	code, out, _ = call(append([]string{"findings", "--state", "open"}, base[:4]...)...)
	if code != 0 || !strings.Contains(out, dup) || !strings.Contains(out, orphan) {
		t.Fatalf("findings: %d %s", code, out)
	}
	code, out, stderr = call(append([]string{"refund", "--all", "--dry-run"}, base...)...)
	if code != 0 || !strings.Contains(out, "would refund") || sim.Requests()["POST /v1/refunds"] != 0 {
		t.Fatalf("dry run: %d %s %s", code, out, stderr)
	}
	code, out, stderr = call(append([]string{"refund", fmt.Sprint(dupID)}, base...)...)
	if code != 0 || !strings.Contains(out, "refunded 1") {
		t.Fatalf("refund: %d %s %s", code, out, stderr)
	}
	if ch, _ := sim.Charge(dup); !ch.Refunded {
		t.Fatal("duplicate not refunded")
	}
	if ch, _ := sim.Charge(canon); ch.AmountRefunded != 0 {
		t.Fatal("canonical refunded")
	}
	code, _, stderr = call(append([]string{"refund", fmt.Sprint(dupID)}, base...)...)
	if code != 2 || !strings.Contains(stderr, "refunded") {
		t.Fatalf("refunding a refunded finding: %d %s", code, stderr)
	}
	code, _, stderr = call(append([]string{"resolve", fmt.Sprint(orphanID)}, base[:4]...)...)
	if code != 0 {
		t.Fatalf("resolve: %d %s", code, stderr)
	}
	code, _, stderr = call(append([]string{"dismiss", fmt.Sprint(orphanID)}, base[:4]...)...)
	if code != 2 {
		t.Fatalf("dismissing a resolved finding: %d %s", code, stderr)
	}
	// Nothing open is left: the audit is clean.
	code, out, stderr = call(append(append([]string{"run"}, base...), window...)...)
	if code != 0 || !strings.Contains(out, "0 open") {
		t.Fatalf("final audit: %d %s %s", code, out, stderr)
	}
}

// --max-refunds-24h is persisted: two `auditor refund` processes in a row
// cannot together pass it; the second says which cap skipped what.
func TestRollingRefundCapFlagAcrossProcesses(t *testing.T) {
	t.Parallel()
	pool, url := testenv.DBWithURL(t)
	sim := stripesim.MustNew(stripesim.Config{})
	t.Cleanup(sim.Close)
	at := time.Now().Add(-2 * time.Hour).Truncate(time.Second)
	l := ledger.New(pool, testenv.SchemaOf(pool), clock.NewSim(at))
	var dups []string
	for _, c := range []string{"c1", "c2"} {
		md := stripeapi.PelguardMetadata(c, "2026-11", "k-"+c)
		canon := sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_" + c, Amount: 2500, Created: at, Metadata: md}).ID
		dups = append(dups, sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_" + c, Amount: 2500, Created: at.Add(time.Minute), Metadata: md}).ID)
		if _, err := l.SeedForTest(context.Background(), []ledger.Record{{Key: ledger.Key{CustomerID: c, BillingPeriod: "2026-11"},
			StripeCustomerID: "cus_" + c, AmountCents: 2500, IdempotencyKey: "k-" + c, ChargeID: canon, ChargedAt: at.Add(time.Second)}}); err != nil {
			t.Fatal(err)
		}
	}
	base := []string{"--database-url", url, "--db-schema", testenv.SchemaOfURL(url), "--stripe-key", "sk_test_x", "--stripe-api-base", sim.URL()}
	window := []string{"--from", at.Add(-time.Hour).Format(time.RFC3339), "--to", at.Add(time.Hour).Format(time.RFC3339)}
	if code, _, stderr := call(append(append([]string{"run"}, base...), window...)...); code != 1 {
		t.Fatalf("audit: exit %d, %s", code, stderr)
	}
	refund := append([]string{"refund", "--all", "--max-refunds", "1", "--max-refunds-24h", "1"}, base...)
	if code, out, stderr := call(refund...); code != cli.ExitFindings || !strings.Contains(out, "refunded 1") {
		t.Fatalf("first refund: %d %s %s", code, out, stderr)
	}
	code, out, stderr := call(append([]string{"refund", "--all", "--max-refunds-24h", "1"}, base...)...)
	if code != cli.ExitFindings || !strings.Contains(out, "refunded 0") || !strings.Contains(out, "max_refunds_24h") {
		t.Fatalf("second refund: %d %s %s", code, out, stderr)
	}
	refunded := 0
	for _, id := range dups {
		if ch, _ := sim.Charge(id); ch.Refunded {
			refunded++
		}
	}
	if refunded != 1 || sim.Requests()["POST /v1/refunds"] != 1 {
		t.Fatalf("%d duplicates refunded, %d POSTs; want 1, 1", refunded, sim.Requests()["POST /v1/refunds"])
	}
}

// `auditor --help` lists the subcommands (it used to show run's flags
// only); `help` prints the same on stdout and exits 0; `migrate --help` and
// `-h` print the migrate usage and exit 0; `version`, `--version` print the
// version.
func TestHelpListsCommands(t *testing.T) {
	t.Parallel()
	code, _, stderr := call("--help")
	for _, want := range []string{"Commands:", "\n  refund ID|--all", "\n  findings", "\n  resolve ID", "\n  dismiss ID",
		"\n  migrate up|down|status", "Exit status", "Stripe permissions", "--wait-for-deps"} {
		if code != 0 || !strings.Contains(stderr, want) {
			t.Errorf("--help: exit %d, lacks %q:\n%s", code, want, stderr)
		}
	}
	if code, out, _ := call("help"); code != 0 || !strings.Contains(out, "\n  refund ID|--all") {
		t.Errorf("help: exit %d\n%s", code, out)
	}
	if code, out, _ := call("help", "refund"); code != 0 || !strings.Contains(out, "--all") {
		t.Errorf("help refund: exit %d\n%s", code, out)
	}
	for _, args := range [][]string{{"migrate", "--help"}, {"migrate", "-h"}, {"refund", "--help"}, {"findings", "-h"}} {
		if code, _, stderr := call(args...); code != 0 || !strings.Contains(stderr, "Usage: pelguard-auditor "+args[0]) {
			t.Errorf("%v: exit %d\n%s", args, code, stderr)
		}
	}
	for _, arg := range []string{"version", "--version"} {
		if code, out, _ := call(arg); code != 0 || !strings.HasPrefix(out, "pelguard-auditor ") {
			t.Errorf("%s: exit %d %q", arg, code, out)
		}
	}
}

// TestNoArgumentsPrintsUsage: a bare `pelguard-auditor` audits nothing: it
// names `pelguard-auditor run`, lists the commands and exits 2, before it
// opens anything.
func TestNoArgumentsPrintsUsage(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://u:p@127.0.0.1:1/db?sslmode=disable")
	var out, errb bytes.Buffer
	code := Main(context.Background(), nil, &out, &errb)
	if code != cli.ExitError {
		t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, cli.ExitError, out.String(), errb.String())
	}
	for _, want := range []string{"pelguard-auditor run", "Commands:", "refund", "usage-findings"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errb.String())
		}
	}
}
