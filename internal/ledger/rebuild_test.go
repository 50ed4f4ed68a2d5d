package ledger_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
)

// rebuilt is e's charge as Stripe has it.
func rebuilt(e event.Event, chargeID string, attempt int) ledger.RebuiltCharge {
	return ledger.RebuiltCharge{Key: ledger.EventKey(e), StripeCustomerID: e.StripeCustomerID, AmountCents: e.AmountCents,
		Currency: e.Currency, IdempotencyKey: e.Key("test"), Attempt: attempt, ChargeID: chargeID,
		Created: time.Date(2026, 11, 30, 11, 0, 0, 0, time.UTC)}
}

func mustRebuild(t *testing.T, b bundle, c ledger.RebuiltCharge, want ledger.RebuildOutcome) ledger.RebuildResult {
	t.Helper()
	res, err := b.l.Rebuild(context.Background(), c)
	if err != nil {
		t.Fatalf("rebuilding %s with %s: %v", c.Key, c.ChargeID, err)
	}
	if res.Outcome != want {
		t.Fatalf("rebuilding %s with %s: %s (%s), want %s", c.Key, c.ChargeID, res.Outcome, res.Detail, want)
	}
	return res
}

// A row a failover took back to a declined attempt whose next attempt
// succeeded is charged, its retry cancelled and its reservation taken
// again; one whose last failure is of a later attempt than the charge is
// left for a person.
func TestRebuildChargesADeclinedRowOnlyWithALaterAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	if _, err := b.l.SetCap(ctx, "2026-11", 100_000); err != nil {
		t.Fatal(err)
	}
	declined := func(e event.Event) ledger.Record {
		c, err := b.l.Reserve(ctx, req(e, "A"))
		if err != nil {
			t.Fatal(err)
		}
		r, err := b.l.Finish(ctx, c.Record, ledger.Outcome{Status: ledger.StatusDeclined, Error: "insufficient funds",
			RetryAt: b.clk.Now().Add(time.Hour)})
		if err != nil || r.Attempt != 2 || r.CapReservedCents != 0 {
			t.Fatalf("declined %+v %v", r, err)
		}
		return r
	}
	e1, e2 := ev("d1", 2500), ev("d2", 2600)
	before := declined(e1)
	declined(e2)
	res := mustRebuild(t, b, rebuilt(e1, "ch_attempt2", 2), ledger.RebuildRepaired)
	r := res.Record
	if r.Status != ledger.StatusCharged || r.ChargeID != "ch_attempt2" || !r.NextAttemptAt.IsZero() || r.Attempt != 2 ||
		r.CapReservedCents != 2500 || r.Epoch <= before.Epoch || r.ChargedAt.IsZero() {
		t.Fatalf("repaired row %+v", r)
	}
	if c, _ := b.l.Cap(ctx, "2026-11"); c.ReservedCents != 2500 {
		t.Fatalf("the cap reserves %d, want 2500", c.ReservedCents)
	}
	res = mustRebuild(t, b, rebuilt(e2, "ch_attempt1", 1), ledger.RebuildConflict)
	if !strings.Contains(res.Detail, "attempt 2") {
		t.Fatalf("detail %q", res.Detail)
	}
	if got, _ := b.l.Get(ctx, ledger.EventKey(e2)); got.Status != ledger.StatusDeclined {
		t.Fatalf("d2 changed: %+v", got)
	}
}

// What Rebuild never does: give a charged row another charge, take a row
// of another amount, record a charge another key records or one pelguard
// refunded, or replace a processing row's debit it was not told is over.
func TestRebuildRefusesWhatIsNotTheKeysCharge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	charged, pending, processing := ev("charged", 2500), ev("pending", 2500), ev("processing", 2500)
	c, _ := b.l.Reserve(ctx, req(charged, "A"))
	if _, err := b.l.Finish(ctx, c.Record, ledger.Outcome{Status: ledger.StatusCharged, ChargeID: "ch_A"}); err != nil {
		t.Fatal(err)
	}
	mustRebuild(t, b, rebuilt(charged, "ch_A", 1), ledger.RebuildUnchanged)
	mustRebuild(t, b, rebuilt(charged, "ch_B", 1), ledger.RebuildConflict)

	if _, err := b.l.Reserve(ctx, req(pending, "A")); err != nil {
		t.Fatal(err)
	}
	other := rebuilt(pending, "ch_P", 1)
	other.AmountCents = 9999
	mustRebuild(t, b, other, ledger.RebuildConflict)

	res := mustRebuild(t, b, rebuilt(ev("elsewhere", 2500), "ch_A", 1), ledger.RebuildConflict)
	if !strings.Contains(res.Detail, "charged/2026-11") {
		t.Fatalf("detail %q does not name the key that records the charge", res.Detail)
	}

	if _, err := b.l.DB().Exec(ctx, `INSERT INTO {schema}.refund_ledger (refunded_at, charge_id, refund_id, amount_cents, currency, source)
		VALUES (now(), 'ch_dup', 're_1', 2500, 'usd', 'test')`); err != nil {
		t.Fatal(err)
	}
	mustRebuild(t, b, rebuilt(ev("refunded", 2500), "ch_dup", 1), ledger.RebuildRefunded)
	if _, err := b.l.Get(ctx, ledger.Key{CustomerID: "refunded", BillingPeriod: "2026-11"}); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("a row for the refunded charge: %v", err)
	}

	p, _ := b.l.Reserve(ctx, req(processing, "A"))
	if _, err := b.l.Finish(ctx, p.Record, ledger.Outcome{Status: ledger.StatusProcessing, ChargeID: "ch_debit1"}); err != nil {
		t.Fatal(err)
	}
	mustRebuild(t, b, rebuilt(processing, "ch_debit2", 2), ledger.RebuildConflict)
	over := rebuilt(processing, "ch_debit2", 2)
	over.Replaces = "ch_debit1"
	if r := mustRebuild(t, b, over, ledger.RebuildRepaired).Record; r.ChargeID != "ch_debit2" || r.Status != ledger.StatusCharged || r.Attempt != 2 {
		t.Fatalf("replaced debit %+v", r)
	}
}

// A charge of a period whose cap its reservations already reach is recorded
// all the same (the money was taken), the cap clipped; RecountCaps says by
// how much the rows pass it, and sets lost reservations back.
func TestRebuildPastTheCapAndRecount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	if _, err := b.l.SetCap(ctx, "2026-11", 4000); err != nil {
		t.Fatal(err)
	}
	if res := mustRebuild(t, b, rebuilt(ev("a", 2500), "ch_a", 1), ledger.RebuildInserted); res.OverCap {
		t.Fatal("the first charge fits")
	}
	pending := rebuilt(ev("b", 2500), "ch_b", 1)
	pending.Pending = true
	res := mustRebuild(t, b, pending, ledger.RebuildInserted)
	if !res.OverCap || res.Record.Status != ledger.StatusProcessing || res.Record.NextPollAt.IsZero() || res.Record.CapReservedCents != 2500 {
		t.Fatalf("the second: %+v", res)
	}
	if c, _ := b.l.Cap(ctx, "2026-11"); c.ReservedCents != 4000 {
		t.Fatalf("the cap reserves %d, want 4000 (clipped)", c.ReservedCents)
	}
	if _, err := b.l.DB().Exec(ctx, `UPDATE {schema}.spend_caps SET reserved_cents = 0`); err != nil {
		t.Fatal(err)
	}
	rcs, err := b.l.RecountCaps(ctx, []string{"2026-11", "2026-10"})
	if err != nil || len(rcs) != 1 {
		t.Fatalf("%+v %v", rcs, err)
	}
	if rc := rcs[0]; rc.Before != 0 || rc.RowsCents != 5000 || rc.ReservedCents != 4000 || !rc.Over() {
		t.Fatalf("recount %+v", rc)
	}
	updated := rcs[0].UpdatedAt
	b.clk.Advance(time.Minute)
	if rcs, err = b.l.RecountCaps(ctx, []string{"2026-11"}); err != nil || !rcs[0].UpdatedAt.Equal(updated) {
		t.Fatalf("a recount that changes nothing wrote: %+v %v", rcs, err)
	}
}

// The repair's writes take the locks a refund takes: a Rebuild of a charge
// whose refund is deciding waits for it, then refuses the refunded charge.
func TestRebuildWaitsForARefundOfTheKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	e := ev("race", 2500)
	tx, err := b.l.Begin(ctx) // the refund, holding the Stripe customer's lock as a legacy refund does
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	sk := ledger.StripeLockKey(e.StripeCustomerID, e.BillingPeriod)
	if err := b.l.LockKey(ctx, tx, sk); err != nil {
		t.Fatal(err)
	}
	done := make(chan ledger.RebuildResult, 1)
	go func() {
		res, err := b.l.Rebuild(ctx, rebuilt(e, "ch_dup", 1))
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	waitForWaiters(t, b.l, sk, 1)
	if _, err := tx.Exec(ctx, `INSERT INTO {schema}.refund_ledger (refunded_at, charge_id, refund_id, amount_cents,
		currency, source) VALUES (now(), 'ch_dup', 're_1', 2500, 'usd', 'test')`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if res := <-done; res.Outcome != ledger.RebuildRefunded {
		t.Fatalf("rebuilding a charge refunded meanwhile: %+v", res)
	}
}

// refund_ledger and refunded_only findings are rebuilt once, whatever the
// reruns.
func TestRebuildRefundsAndFindingsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	at := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	refunds := []ledger.RebuiltRefund{
		{RefundID: "re_1", ChargeID: "ch_1", AmountCents: 100, Currency: "usd", Created: at, CustomerID: "c1", BillingPeriod: "2026-11"},
		{RefundID: "re_2", ChargeID: "ch_2", AmountCents: 200, Currency: "usd", Created: at},
	}
	for i, want := range []int{2, 0} {
		if n, err := b.l.RebuildRefunds(ctx, refunds); err != nil || n != want {
			t.Fatalf("pass %d: %d inserted (%v), want %d", i, n, err, want)
		}
	}
	var n int
	if err := b.l.DB().QueryRow(ctx, `SELECT count(*) FROM {schema}.refund_ledger WHERE source = $1 AND refunded_at = $2`,
		ledger.RefundSourceRebuilt, at).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d rebuilt refunds (%v)", n, err)
	}
	got, err := b.l.RefundedCharges(ctx, []string{"ch_1", "ch_3"})
	if err != nil || !got["ch_1"] || got["ch_3"] {
		t.Fatalf("refunded charges %v %v", got, err)
	}

	e := ev("refunded_only", 2500)
	f := ledger.RefundedOnly{Key: ledger.EventKey(e), StripeCustomerID: e.StripeCustomerID, IdempotencyKey: e.Key("test"),
		ChargeID: "ch_r", AmountCents: 2500, Currency: "usd", Detail: "only refunded"}
	for i, wantNew := range []bool{true, false} {
		recorded, isNew, err := b.l.RecordRefundedOnly(ctx, f)
		if err != nil || !recorded || isNew != wantNew {
			t.Fatalf("pass %d: recorded %v new %v (%v)", i, recorded, isNew, err)
		}
	}
	charged := ev("charged_now", 2500)
	c, _ := b.l.Reserve(ctx, req(charged, "A"))
	if _, err := b.l.Finish(ctx, c.Record, ledger.Outcome{Status: ledger.StatusCharged, ChargeID: "ch_c"}); err != nil {
		t.Fatal(err)
	}
	f.Key, f.IdempotencyKey = ledger.EventKey(charged), charged.Key("test")
	if recorded, _, err := b.l.RecordRefundedOnly(ctx, f); err != nil || recorded {
		t.Fatalf("a finding for a key charged meanwhile: %v %v", recorded, err)
	}
}
