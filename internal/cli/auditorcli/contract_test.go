package auditorcli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

// The auditor's contract, as --help and the README say it (issue 25).

// --settle-delay 0 audits up to now: a duplicate made two minutes ago is
// found (it used to mean the default 10 minutes, silently). A negative or
// empty value stops the auditor at start with a message naming the flag.
func TestSettleDelayZeroAuditsUpToNow(t *testing.T) {
	t.Parallel()
	pool, url := testenv.DBWithURL(t)
	sim := stripesim.MustNew(stripesim.Config{})
	t.Cleanup(sim.Close)
	at := time.Now().Add(-2 * time.Minute).Truncate(time.Second)
	md := stripeapi.PelguardMetadata("c1", "2026-11", "k1")
	canon := sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_1", Amount: 2500, Created: at, Metadata: md}).ID
	dup := sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_1", Amount: 2500, Created: at.Add(time.Second), Metadata: md}).ID
	l := ledger.New(pool, testenv.SchemaOf(pool), clock.NewSim(at))
	if _, err := l.SeedForTest(context.Background(), []ledger.Record{{Key: ledger.Key{CustomerID: "c1", BillingPeriod: "2026-11"},
		StripeCustomerID: "cus_1", AmountCents: 2500, IdempotencyKey: "k1", ChargeID: canon, ChargedAt: at.Add(time.Second)}}); err != nil {
		t.Fatal(err)
	}
	base := []string{"--database-url", url, "--db-schema", testenv.SchemaOfURL(url), "--stripe-key", "sk_test_x", "--stripe-api-base", sim.URL(),
		"--from", at.Add(-time.Hour).Format(time.RFC3339)}
	for _, bad := range []string{"-1m", "", "ten"} {
		if code, _, stderr := call(append([]string{"run", "--settle-delay", bad}, base...)...); code != 2 || !strings.Contains(stderr, "settle-delay") {
			t.Errorf("--settle-delay %q: exit %d, %q; want 2 naming the flag", bad, code, stderr)
		}
	}
	code, out, stderr := call(append([]string{"run", "--json", "--settle-delay", "0"}, base...)...)
	var rep struct {
		To       time.Time `json:"to"`
		Findings []struct {
			Kind     string `json:"kind"`
			ChargeID string `json:"charge_id"`
		} `json:"findings"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("report %q (%v): %s", out, err, stderr)
	}
	if code != 1 || len(rep.Findings) != 1 || rep.Findings[0].ChargeID != dup || time.Since(rep.To) > time.Minute {
		t.Fatalf("--settle-delay 0: exit %d, window to %s, findings %+v; want exit 1, up to now, the duplicate %s", code, rep.To, rep.Findings, dup)
	}
}

// A run exits 1 while open findings remain, detected by it or not: the
// switching runbook's step 6 used to print "0 open" and exit 0 although
// `consumer import` (step 3) had stored an open duplicate the run's window
// did not show again (here: an empty window). Refunding or closing it is
// what makes the run clean.
func TestRunExitsOneWhileOpenFindingsRemain(t *testing.T) {
	t.Parallel()
	pool, url := testenv.DBWithURL(t)
	sim := stripesim.MustNew(stripesim.Config{})
	t.Cleanup(sim.Close)
	schema := testenv.SchemaOf(pool)
	var id int64
	if err := pool.QueryRow(context.Background(), `INSERT INTO `+schema+`.audit_findings (kind, subject, legacy, customer_id,
			billing_period, stripe_customer_id, charge_id, canonical_charge_id, amount_cents, currency, detail)
		VALUES ('duplicate_charge', 'ch_team2', true, 'c03', '2026-11', 'cus_c03', 'ch_team2', 'ch_team1', 1003, 'usd',
			'a second charge for this key, made before pelguard (found by consumer import)') RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	base := []string{"--database-url", url, "--db-schema", testenv.SchemaOfURL(url), "--stripe-key", "sk_test_x", "--stripe-api-base", sim.URL()}
	now := time.Now().UTC()
	window := []string{"--from", now.Add(-2 * time.Hour).Format(time.RFC3339), "--to", now.Add(-time.Hour).Format(time.RFC3339)}
	code, out, stderr := call(append(append([]string{"run", "--legacy"}, base...), window...)...)
	if code != 1 || !strings.Contains(out, "1 open") {
		t.Fatalf("with the import's duplicate open: exit %d\n%s%s\nwant exit 1 and 1 open", code, out, stderr)
	}
	// Another period's run is not about it.
	code, out, _ = call(append(append([]string{"run", "--legacy", "--period", "2026-10"}, base...), window...)...)
	if code != 0 || !strings.Contains(out, "0 open") {
		t.Fatalf("--period 2026-10: exit %d\n%s", code, out)
	}
	if code, _, stderr := call("dismiss", "--database-url", url, "--db-schema", testenv.SchemaOfURL(url), fmt.Sprint(id)); code != 0 {
		t.Fatalf("dismiss: exit %d %s", code, stderr)
	}
	if code, out, _ := call(append(append([]string{"run", "--legacy"}, base...), window...)...); code != 0 || !strings.Contains(out, "0 open") {
		t.Fatalf("after dismissing it: exit %d\n%s", code, out)
	}
}

// Code, --help and the README say one thing about orphans: `auditor
// refund` refuses one (it is usually the customer's only charge), and the
// help of run and refund say so; nothing is refunded at Stripe.
func TestOrphansAreNeverRefunded(t *testing.T) {
	t.Parallel()
	_, url := testenv.DBWithURL(t)
	sim := stripesim.MustNew(stripesim.Config{})
	t.Cleanup(sim.Close)
	at := time.Now().Add(-2 * time.Hour).Truncate(time.Second)
	orphan := sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_2", Amount: 900, Created: at,
		Metadata: stripeapi.PelguardMetadata("c2", "2026-11", "k2")}).ID
	base := []string{"--database-url", url, "--db-schema", testenv.SchemaOfURL(url), "--stripe-key", "sk_test_x", "--stripe-api-base", sim.URL()}
	window := []string{"--from", at.Add(-time.Hour).Format(time.RFC3339), "--to", at.Add(time.Hour).Format(time.RFC3339)}
	code, out, stderr := call(append(append([]string{"run", "--json"}, base...), window...)...)
	var rep struct {
		Findings []struct {
			ID   int64  `json:"id"`
			Kind string `json:"kind"`
		} `json:"findings"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 1 || len(rep.Findings) != 1 || rep.Findings[0].Kind != "orphan_charge" {
		t.Fatalf("audit: exit %d, %s (%v) %s; want one orphan_charge for %s", code, out, err, stderr, orphan)
	}
	code, _, stderr = call(append([]string{"refund", fmt.Sprint(rep.Findings[0].ID)}, base...)...)
	if code != 2 || !strings.Contains(stderr, "only charge") || sim.Requests()["POST /v1/refunds"] != 0 {
		t.Fatalf("refund of an orphan: exit %d, %q, %d refunds; want 2, the reason, none", code, stderr, sim.Requests()["POST /v1/refunds"])
	}
	for _, cmd := range []string{"run", "refund"} {
		if code, _, stderr := call(cmd, "--help"); code != 0 || !strings.Contains(strings.Join(strings.Fields(stderr), " "), "orphan_charge is usually the customer's only charge") {
			t.Errorf("%s --help: exit %d, does not say an orphan is never refunded:\n%s", cmd, code, stderr)
		}
	}
}
