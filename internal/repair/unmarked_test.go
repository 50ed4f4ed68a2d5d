package repair_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/repair"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

// With --charge-metadata=false pelguard's charges say nothing of their key:
// a pending row is looked up by its business identity (one list call per
// row), and a lost row of such a charge is not guessed from the charge.
func TestRepairLooksUpRowsWhoseChargesCarryNoMetadata(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	sc, err := stripeapi.New(stripeapi.Config{APIKey: simKey, BaseURL: w.sim.URL(), Mode: stripeapi.ModeCharges, MaxNetworkRetries: stripeapi.NoRetries})
	if err != nil {
		t.Fatal(err)
	}
	w.sc = sc
	bill := func(e event.Event, charge, finish bool) (ledger.Claim, stripeapi.Charge) {
		t.Helper()
		claim, err := w.l.Reserve(ctx, ledger.ReserveRequest{Event: e, IdempotencyKey: e.Key(ns), Owner: "A", Lease: time.Minute, MessageID: "1-0"})
		if err != nil {
			t.Fatal(err)
		}
		if !charge {
			return claim, stripeapi.Charge{}
		}
		ch, err := sc.Charge(ctx, stripeapi.ChargeRequest{IdempotencyKey: e.Key(ns), StripeCustomerID: e.StripeCustomerID,
			AmountCents: e.AmountCents, Currency: e.Currency, Description: "Usage billing for " + period})
		if err != nil {
			t.Fatal(err)
		}
		if finish {
			if _, err := w.l.Finish(ctx, claim.Record, ledger.Outcome{Status: ledger.StatusCharged, ChargeID: ch.ID}); err != nil {
				t.Fatal(err)
			}
		}
		return claim, ch
	}
	e1, e2, e3, e4 := ev(1), ev(2), ev(3), ev(4)
	claim1, ch1 := bill(e1, true, false) // charged, its record lost: pending
	bill(e2, true, true)                 // charged, row lost
	bill(e3, false, false)               // in flight, never charged
	bill(e4, true, true)                 // charged, survived
	w.lose(e2)
	before3, _ := w.row(e3)
	lists := func() int64 { return w.sim.Requests()["GET /v1/charges"] }

	// Without the flag, only rows of Stripe customers with an unmarked
	// charge since Since are looked up: c1 (and c4, which is charged, is
	// no pending row); c3's customer has none.
	start, charges := lists(), w.sim.ChargeCreates()
	rep, err := repair.Run(ctx, w.cfg())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Repaired != 1 || rep.Rebuilt != 0 || len(rep.Keys) != 1 || rep.Keys[0] != ledger.EventKey(e1) {
		t.Fatalf("report %+v: want c1 repaired, nothing rebuilt", rep)
	}
	if got := lists() - start; got != 2 {
		t.Fatalf("%d list calls: want 2 (the account's charges, then c1's look-up)", got)
	}
	if r, _ := w.row(e1); r.Status != ledger.StatusCharged || r.ChargeID != ch1.ID || r.LeaseOwner != "" {
		t.Fatalf("c1: %+v", r)
	}
	if _, err := w.l.Finish(ctx, claim1.Record, ledger.Outcome{Status: ledger.StatusCharged, ChargeID: ch1.ID}); err == nil {
		t.Fatal("c1's holder from before the repair could still finish")
	}
	if _, ok := w.row(e2); ok {
		t.Fatal("c2's row was guessed from a charge without metadata")
	}
	if !strings.Contains(strings.Join(rep.Notes, "\n"), "1 charges without pelguard's metadata since") {
		t.Fatalf("notes do not count c2's unrecorded charge:\n%s", strings.Join(rep.Notes, "\n"))
	}

	// With it, every pending and processing row is looked up: c3, whose
	// look-up finds nothing, is left alone.
	cfg := w.cfg()
	cfg.UnmarkedCharges = true
	snap := testenv.Snapshot(t, w.pool, w.schema)
	start = lists()
	rep, err = repair.Run(ctx, cfg)
	if err != nil || rep.Repaired+rep.Rebuilt != 0 {
		t.Fatalf("rerun %+v %v", rep, err)
	}
	if got := lists() - start; got != 2 {
		t.Fatalf("%d list calls: want 2 (the account's charges, then c3's look-up)", got)
	}
	if got := testenv.Snapshot(t, w.pool, w.schema); got != snap {
		t.Fatal("the rerun changed the ledger")
	}
	if after3, _ := w.row(e3); after3.Epoch != before3.Epoch || after3.LeaseOwner != "A" {
		t.Fatalf("c3 was touched: %+v", after3)
	}
	if w.sim.ChargeCreates() != charges {
		t.Fatal("the repair charged")
	}
}

// A key whose pending row is the repair's to decide but whose only charge
// is fully refunded stays pending, with a finding.
func TestRepairLeavesAFullyRefundedKeyPendingWithAFinding(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	e := ev(1)
	claim, ch := w.bill(e, false)
	if _, err := w.sim.RefundByHand(ch.ID, 0); err != nil {
		t.Fatal(err)
	}
	rep, err := repair.Run(ctx, w.cfg())
	if err != nil || rep.Findings != 1 || rep.Repaired+rep.Rebuilt != 0 {
		t.Fatalf("report %+v %v", rep, err)
	}
	if r, _ := w.row(e); r.Status != ledger.StatusPending || r.Epoch != claim.Record.Epoch {
		t.Fatalf("the refunded key's row: %+v", r)
	}
	if n := w.int(`SELECT count(*) FROM audit_findings WHERE kind = 'refunded_only' AND customer_id = 'c1'`); n != 1 {
		t.Fatalf("%d findings", n)
	}
}
