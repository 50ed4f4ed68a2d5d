package meterledger_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// DeliveredTotals sums what was delivered, per Stripe customer, over the
// events' timestamps [from, to): sending, failed and parked events, other
// meters and other times are not in it; negative values are.
func TestDeliveredTotals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	type ev struct {
		cust, meter string
		value       int64
		at          time.Duration
		res         meterledger.Result
	}
	for _, e := range []ev{
		{"cus_1", "api", 3, -3 * time.Hour, meterledger.Delivered},
		{"cus_1", "api", 4, -2 * time.Hour, meterledger.Delivered},
		{"cus_1", "api", -2, -time.Hour, meterledger.Delivered},
		{"cus_1", "api", 100, -time.Hour - time.Second, meterledger.Release},
		{"cus_2", "api", 7, -2 * time.Hour, meterledger.Delivered},
		{"cus_2", "api", 50, -2*time.Hour + time.Second, meterledger.Failed},
		{"cus_2", "tokens", 9, -2 * time.Hour, meterledger.Delivered},
		{"cus_3", "api", 1, -5 * time.Hour, meterledger.Delivered}, // before from
		{"cus_3", "api", 1, 0, meterledger.Delivered},              // at to: excluded
	} {
		c := b.one(t, req(mev(e.cust, e.meter, e.value, t0.Add(e.at)), "A"))
		if c.Decision != meterledger.Acquired {
			t.Fatalf("%+v: %v", e, c.Decision)
		}
		b.finish(t, meterledger.Outcome{Hold: c.Hold(), Result: e.res, Reason: "x"})
	}
	got, err := b.l.DeliveredTotals(ctx, "api", t0.Add(-4*time.Hour), t0)
	want := []meterledger.CustomerTotal{{StripeCustomerID: "cus_1", Value: 5, Events: 3}, {StripeCustomerID: "cus_2", Value: 7, Events: 1}}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("totals %+v %v, want %+v", got, err, want)
	}
	if got, err := b.l.DeliveredTotals(ctx, "nothing", t0.Add(-4*time.Hour), t0); err != nil || len(got) != 0 {
		t.Fatalf("an unknown meter: %v %v", got, err)
	}
}

// Lookup answers in the order asked, across days, with the rows missing
// marked.
func TestLookup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	e1 := mev("cus_1", "api", 1, t0.Add(-48*time.Hour))
	e2 := mev("cus_2", "api", 2, t0)
	missing := mev("cus_3", "api", 3, t0)
	cs := b.reserve(t, req(e1, "A"), req(e2, "A"))
	keys := []meterledger.Key{meterledger.KeyOf(e2, req(e2, "A").Identifier), meterledger.KeyOf(missing, req(missing, "A").Identifier),
		meterledger.KeyOf(e1, req(e1, "A").Identifier)}
	recs, found, err := b.l.Lookup(ctx, keys)
	if err != nil || !slices.Equal(found, []bool{true, false, true}) || recs[0] != cs[1].Record || recs[2] != cs[0].Record {
		t.Fatalf("lookup: %v %v", found, err)
	}
}

// After a detected rollback (internal/rollback raises the epoch floor and
// calls Fence in the same transaction): no holder from before passes a
// fenced write, the slots are free, and the rows are re-sent above the
// floor. Stuck lists the unknown outcomes nobody is re-sending.
func TestFenceAndStuck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	e1, e2 := mev("cus_1", "api", 1, t0), mev("cus_2", "api", 2, t0)
	a1 := b.one(t, req(e1, "A"))
	a2 := b.one(t, req(e2, "A"))
	b.finish(t, meterledger.Outcome{Hold: a2.Hold(), Result: meterledger.Release, Reason: "timeout"})
	b.clk.Advance(2 * time.Hour)
	if _, err := b.l.ExtendMany(ctx, []meterledger.Hold{a1.Hold()}, 3*time.Hour); err != nil {
		t.Fatal(err)
	}
	stuck, err := b.l.Stuck(ctx, b.clk.Now().Add(-time.Hour), 10)
	if err != nil || len(stuck) != 1 || stuck[0].Identifier != a2.Record.Identifier {
		t.Fatalf("stuck: %d %v", len(stuck), err)
	}

	tx, err := pg.NewDB(b.pool, testenv.SchemaOf(b.pool)).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	live, err := meterledger.MaxLiveEpoch(ctx, tx)
	if err != nil || live != 1 {
		t.Fatalf("live epoch %d %v", live, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE {schema}.ledger_fence SET epoch_floor = 100`); err != nil {
		t.Fatal(err)
	}
	if n, err := meterledger.Fence(ctx, tx, 100); err != nil || n != 2 {
		t.Fatalf("fenced %d %v", n, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if rec := b.finish(t, meterledger.Outcome{Hold: a1.Hold(), Result: meterledger.Delivered}); rec[0] {
		t.Fatal("a holder from before the rollback finished")
	}
	if lost, _ := b.l.ExtendMany(ctx, []meterledger.Hold{a1.Hold()}, time.Minute); !lost[0] {
		t.Fatal("a holder from before the rollback kept its lease")
	}
	if n := b.count(t, `SELECT count(*) FROM meter_inflight`); n != 0 {
		t.Fatalf("%d slots kept", n)
	}
	for _, e := range []event.MeterEvent{e1, e2} {
		if c := b.one(t, req(e, "C")); c.Decision != meterledger.TakenOver || c.Record.Epoch != 102 {
			t.Fatalf("after the fence: %v epoch %d", c.Decision, c.Record.Epoch)
		}
	}
}
