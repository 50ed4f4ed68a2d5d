package importer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/importer"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/teamsys"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

const testKey = "sk_test_importer0000000001"

func ev(i int) event.Event {
	return event.Event{CustomerID: "c_" + string(rune('0'+i)), StripeCustomerID: "cus_" + string(rune('0'+i)),
		AmountCents: int64(1000 + i), BillingPeriod: "2026-11", Currency: "usd"}
}

// A team's history: c1 billed, c2 declined, c3's row names a charge Stripe
// does not have, c4 billed twice (the team's monitor re-charged it a day
// later, under a key Stripe had forgotten), c5 billed but its row never
// written (killed before the INSERT).
func TestImportBringsTheTeamsHistoryAndRerunsChangeNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.DB(t)
	schema := testenv.SchemaOf(pool)
	team := "team_" + testenv.Suffix()
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+team+" CASCADE") })
	if err := teamsys.CreateTable(ctx, pool, team); err != nil {
		t.Fatal(err)
	}
	sim := stripesim.MustNew(stripesim.Config{Now: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)})
	t.Cleanup(sim.Close)
	sc, err := stripeapi.New(stripeapi.Config{APIKey: testKey, BaseURL: sim.URL(), Mode: stripeapi.ModeCharges, MaxNetworkRetries: stripeapi.NoRetries})
	if err != nil {
		t.Fatal(err)
	}
	charge := func(e event.Event) stripeapi.Charge {
		t.Helper()
		ch, err := sc.Charge(ctx, stripeapi.ChargeRequest{IdempotencyKey: e.Key(teamsys.IdempotencyNamespace),
			StripeCustomerID: e.StripeCustomerID, AmountCents: e.AmountCents, Currency: "usd", Description: "Usage billing for 2026-11"})
		if err != nil {
			t.Fatal(err)
		}
		return ch
	}
	e1, e2, e3, e4, e5 := ev(1), ev(2), ev(3), ev(4), ev(5)
	ch1, ch4 := charge(e1), charge(e4)
	ch5 := charge(e5)
	sim.Advance(25 * time.Hour)
	ch4b := charge(e4) // the key is forgotten: a second charge
	row := `INSERT INTO ` + team + `.billing_records (customer_id, billing_period, charge_id, amount_cents, status, error) VALUES ($1, '2026-11', $2, $3, $4, $5)`
	for _, r := range [][]any{
		{e1.CustomerID, ch1.ID, e1.AmountCents, "charged", nil},
		{e2.CustomerID, nil, e2.AmountCents, "card_declined", "Your card was declined."},
		{e3.CustomerID, "ch_not_at_stripe", e3.AmountCents, "charged", nil},
		{e4.CustomerID, ch4.ID, e4.AmountCents, "charged", nil},
	} {
		if _, err := pool.Exec(ctx, row, r...); err != nil {
			t.Fatal(err)
		}
	}
	before := testenv.Snapshot(t, pool, team)
	cfg := importer.Config{
		DB: pool, Schema: schema, Stripe: sc, Namespace: teamsys.IdempotencyNamespace,
		FromTable: team + ".billing_records", FromStripe: true, Period: "2026-11",
		Events: []event.Event{e1, e2, e3, e4, e5}, Now: sim.Now,
	}

	dry := cfg
	dry.DryRun = true
	ledgerBefore := testenv.Snapshot(t, pool, schema)
	sum, err := importer.Run(ctx, dry)
	if err != nil {
		t.Fatal(err)
	}
	if sum.ImportedCharged != 3 || sum.ImportedDeclined != 1 || len(sum.Duplicates) != 1 {
		t.Fatalf("dry run summary %+v", sum)
	}
	if got := testenv.Snapshot(t, pool, schema); got != ledgerBefore {
		t.Fatalf("the dry run wrote to pelguard's schema:\n%s", got)
	}

	sum, err = importer.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if sum.ImportedCharged != 3 || sum.ImportedDeclined != 1 || sum.AlreadyInLedger != 0 {
		t.Fatalf("summary %+v", sum)
	}
	if len(sum.Duplicates) != 1 || sum.Duplicates[0].ChargeID != ch4b.ID || sum.Duplicates[0].CanonicalChargeID != ch4.ID {
		t.Fatalf("duplicates %+v; want %s with the team's %s canonical", sum.Duplicates, ch4b.ID, ch4.ID)
	}
	if len(sum.Skipped) != 1 || sum.Skipped[0].CustomerID != e3.CustomerID || !strings.Contains(sum.Skipped[0].Reason, "ch_not_at_stripe") {
		t.Fatalf("skipped %+v; want c3's charge Stripe does not have", sum.Skipped)
	}

	l := ledger.New(pool, schema, nil)
	for _, c := range []struct {
		e      event.Event
		status ledger.Status
		charge string
	}{{e1, ledger.StatusCharged, ch1.ID}, {e2, ledger.StatusDeclined, ""}, {e4, ledger.StatusCharged, ch4.ID}, {e5, ledger.StatusCharged, ch5.ID}} {
		r, err := l.Get(ctx, ledger.EventKey(c.e))
		if err != nil {
			t.Fatalf("%s: %v", c.e.CustomerID, err)
		}
		if r.Status != c.status || r.ChargeID != c.charge || r.IdempotencyKey != c.e.Key(teamsys.IdempotencyNamespace) ||
			r.AmountCents != c.e.AmountCents || r.StripeCustomerID != c.e.StripeCustomerID || r.LeaseOwner != "" {
			t.Fatalf("%s: ledger row %+v", c.e.CustomerID, r)
		}
	}
	if _, err := l.Get(ctx, ledger.EventKey(e3)); err == nil {
		t.Fatal("c3 was recorded although Stripe has no such charge")
	}
	var findings int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM audit_findings WHERE kind = 'duplicate_charge' AND charge_id = $1 AND canonical_charge_id = $2`,
		ch4b.ID, ch4.ID).Scan(&findings); err != nil || findings != 1 {
		t.Fatalf("%d duplicate findings (%v)", findings, err)
	}
	if ok, err := l.HasImportedHistory(ctx, "2026-11"); err != nil || !ok {
		t.Fatalf("2026-11 not recorded as imported: %v %v", ok, err)
	}
	if got := testenv.Snapshot(t, pool, team); got != before {
		t.Fatalf("the import changed the team's table:\nbefore:\n%s\nafter:\n%s", before, got)
	}

	// A rerun changes nothing.
	afterFirst := ledgerRows(t, l)
	sum, err = importer.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if sum.ImportedCharged+sum.ImportedDeclined != 0 || sum.AlreadyInLedger != 4 || len(sum.Conflicts) != 0 {
		t.Fatalf("rerun summary %+v", sum)
	}
	if got := ledgerRows(t, l); got != afterFirst {
		t.Fatalf("the rerun changed the ledger:\n%s\n%s", afterFirst, got)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM audit_findings`).Scan(&findings); err != nil || findings != 1 {
		t.Fatalf("%d findings after the rerun (%v)", findings, err)
	}
}

func ledgerRows(t *testing.T, l *ledger.Ledger) string {
	t.Helper()
	var b strings.Builder
	for _, e := range []event.Event{ev(1), ev(2), ev(3), ev(4), ev(5)} {
		r, err := l.Get(context.Background(), ledger.EventKey(e))
		if err == nil {
			b.WriteString(r.Key.String() + " " + string(r.Status) + " " + r.ChargeID + " " + r.UpdatedAt.String() + "\n")
		}
	}
	return b.String()
}

// --from-query runs in a READ ONLY transaction: a query that writes fails
// and writes nothing.
func TestImportQueryIsReadOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.DB(t)
	sim := stripesim.MustNew(stripesim.Config{})
	t.Cleanup(sim.Close)
	sc, err := stripeapi.New(stripeapi.Config{APIKey: testKey, BaseURL: sim.URL()})
	if err != nil {
		t.Fatal(err)
	}
	_, err = importer.Run(ctx, importer.Config{DB: pool, Schema: testenv.SchemaOf(pool), Stripe: sc, Namespace: "x",
		FromQuery: `INSERT INTO spend_caps (billing_period, cap_cents) VALUES ('2026-11', 1) RETURNING billing_period, billing_period AS customer_id, 'charged' AS status`})
	if err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("a writing query: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM spend_caps`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d caps written (%v)", n, err)
	}
}

// B2B: one Stripe customer pays for two of the team's customers, and only
// c_1 appears in the team's table. c_2's charge (another amount) is not
// filed under c_1 as a "duplicate" (its refund would take c_2's only
// payment): it is reported and not imported.
func TestImportNeverFilesAnotherCustomersChargeAsADuplicate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, team, sim, sc := teamWorld(t)
	c1 := sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_ACME", Amount: 2500, Description: "Usage billing for 2026-11"})
	c2 := sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_ACME", Amount: 4000, Description: "Usage billing for 2026-11"})
	if _, err := pool.Exec(ctx, `INSERT INTO `+team+`.billing_records (customer_id, billing_period, charge_id, amount_cents, status) VALUES ('c_1', '2026-11', $1, 2500, 'charged')`, c1.ID); err != nil {
		t.Fatal(err)
	}
	sum, err := importer.Run(ctx, importer.Config{DB: pool, Schema: testenv.SchemaOf(pool), Stripe: sc, Namespace: "x",
		FromTable: team + ".billing_records", FromStripe: true, Period: "2026-11", Now: sim.Now})
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.Duplicates) != 0 || sum.ImportedCharged != 1 {
		t.Fatalf("summary %+v: want c_1 imported and no duplicate", sum)
	}
	found := false
	for _, p := range sum.Skipped {
		found = found || p.ChargeID == c2.ID
	}
	if !found {
		t.Fatalf("c_2's charge %s is not reported: %+v", c2.ID, sum.Skipped)
	}
}

// The same amount in another currency is not the key's charge either: c_1
// owes 25.00 USD (its event, and the charge its row names); an unmarked
// 25.00 EUR charge on the same Stripe customer is not filed under c_1 as a
// duplicate (its refund would take another customer's only payment).
func TestImportNeverFilesAChargeOfAnotherCurrencyAsADuplicate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, team, sim, sc := teamWorld(t)
	c1 := sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_ACME", Amount: 2500, Description: "Usage billing for 2026-11"})
	eur := sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_ACME", Amount: 2500, Currency: "eur", Description: "Usage billing for 2026-11"})
	if _, err := pool.Exec(ctx, `INSERT INTO `+team+`.billing_records (customer_id, billing_period, charge_id, amount_cents, status) VALUES ('c_1', '2026-11', $1, 2500, 'charged')`, c1.ID); err != nil {
		t.Fatal(err)
	}
	sum, err := importer.Run(ctx, importer.Config{DB: pool, Schema: testenv.SchemaOf(pool), Stripe: sc, Namespace: "x",
		FromTable: team + ".billing_records", FromStripe: true, Period: "2026-11", Now: sim.Now,
		Events: []event.Event{{CustomerID: "c_1", StripeCustomerID: "cus_ACME", AmountCents: 2500, BillingPeriod: "2026-11", Currency: "usd"}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.Duplicates) != 0 || sum.ImportedCharged != 1 {
		t.Fatalf("summary %+v: want c_1 imported with its USD charge and no duplicate", sum)
	}
	var findings int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+testenv.SchemaOf(pool)+`.audit_findings`).Scan(&findings); err != nil || findings != 0 {
		t.Fatalf("%d findings (%v): the EUR charge became a refundable duplicate", findings, err)
	}
	found := false
	for _, p := range sum.Skipped {
		found = found || p.ChargeID == eur.ID
	}
	if !found {
		t.Fatalf("the EUR charge %s is not reported: %+v", eur.ID, sum.Skipped)
	}
}

// teamWorld is a team's billing table (the article's) in a schema of its
// own, an emulator and a charges-mode client of it: the world of an import
// from a team's consumer.
func teamWorld(t *testing.T) (*pgxpool.Pool, string, *stripesim.Server, *stripeapi.Client) {
	t.Helper()
	pool := testenv.DB(t)
	team := "team_" + testenv.Suffix()
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+team+" CASCADE") })
	if err := teamsys.CreateTable(context.Background(), pool, team); err != nil {
		t.Fatal(err)
	}
	sim := stripesim.MustNew(stripesim.Config{})
	t.Cleanup(sim.Close)
	sc, err := stripeapi.New(stripeapi.Config{APIKey: testKey, BaseURL: sim.URL(), Mode: stripeapi.ModeCharges, MaxNetworkRetries: stripeapi.NoRetries})
	if err != nil {
		t.Fatal(err)
	}
	return pool, team, sim, sc
}

// After a failover that took rows back from charged to pending (or left a
// settled debit processing), `consumer import --from-stripe` repairs them
// instead of reporting a conflict: charged with Stripe's charge, under a
// new epoch that fences the holder from before. A key whose only charge is
// fully refunded stays a conflict.
func TestImportRepairsPendingAndProcessingRowsStripeCharged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _, sim, sc := teamWorld(t)
	schema := testenv.SchemaOf(pool)
	l := ledger.New(pool, schema, nil)
	const ns = "x"
	evs := []event.Event{ev(1), ev(2), ev(3)}
	claims := make([]ledger.Claim, len(evs))
	for i, e := range evs {
		c, err := l.Reserve(ctx, ledger.ReserveRequest{Event: e, IdempotencyKey: e.Key(ns), Owner: "A", Lease: time.Hour, MessageID: "1-0"})
		if err != nil || c.Decision != ledger.Acquired {
			t.Fatalf("%+v %v", c, err)
		}
		claims[i] = c
	}
	md := func(e event.Event) map[string]string {
		return stripeapi.PelguardMetadata(e.CustomerID, e.BillingPeriod, e.Key(ns))
	}
	// c1: charged, the record lost (pending with A's lease).
	ch1 := sim.SeedCharge(stripesim.ChargeSeed{Customer: evs[0].StripeCustomerID, Amount: evs[0].AmountCents, Metadata: md(evs[0])})
	// c2: a debit recorded processing, settled at Stripe, the settlement lost.
	ch2 := sim.SeedCharge(stripesim.ChargeSeed{Customer: evs[1].StripeCustomerID, Amount: evs[1].AmountCents, Metadata: md(evs[1]), Status: "pending"})
	if _, err := l.Finish(ctx, claims[1].Record, ledger.Outcome{Status: ledger.StatusProcessing, ChargeID: ch2.ID}); err != nil {
		t.Fatal(err)
	}
	if err := sim.Settle(ch2.ID, true, ""); err != nil {
		t.Fatal(err)
	}
	// c3: its only charge refunded in full.
	ch3 := sim.SeedCharge(stripesim.ChargeSeed{Customer: evs[2].StripeCustomerID, Amount: evs[2].AmountCents, Metadata: md(evs[2])})
	if _, err := sim.RefundByHand(ch3.ID, 0); err != nil {
		t.Fatal(err)
	}
	charges := sim.ChargeCreates()
	cfg := importer.Config{DB: pool, Schema: schema, Stripe: sc, Namespace: ns, FromStripe: true, Period: "2026-11", Now: sim.Now}
	sum, err := importer.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Repaired != 2 || sum.ImportedCharged != 0 || len(sum.Conflicts) != 1 || sum.Conflicts[0].CustomerID != "c_3" {
		t.Fatalf("summary %+v: want c_1 and c_2 repaired, c_3 a conflict", sum)
	}
	for i, ch := range []stripesim.Charge{ch1, ch2} {
		r, err := l.Get(ctx, ledger.EventKey(evs[i]))
		if err != nil || r.Status != ledger.StatusCharged || r.ChargeID != ch.ID || r.LeaseOwner != "" || r.Epoch <= claims[i].Record.Epoch {
			t.Fatalf("%s: %+v %v", evs[i].CustomerID, r, err)
		}
	}
	if _, err := l.Finish(ctx, claims[0].Record, ledger.Outcome{Status: ledger.StatusCharged, ChargeID: ch1.ID}); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Fatalf("c_1's holder from before the import finished: %v", err)
	}
	if r, _ := l.Get(ctx, ledger.EventKey(evs[2])); r.Status != ledger.StatusPending || r.Epoch != claims[2].Record.Epoch {
		t.Fatalf("c_3 (only a refunded charge) was changed: %+v", r)
	}
	if sim.ChargeCreates() != charges {
		t.Fatal("the import charged")
	}
	// A rerun repairs nothing more.
	sum, err = importer.Run(ctx, cfg)
	if err != nil || sum.Repaired != 0 || sum.AlreadyInLedger != 2 || len(sum.Conflicts) != 1 {
		t.Fatalf("rerun %+v %v", sum, err)
	}
}
