package meterledger_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

type bundle struct {
	l    *meterledger.Ledger
	clk  *clock.Sim
	pool *pgxpool.Pool
}

func setup(t testing.TB) bundle {
	t.Helper()
	clk := clock.NewSim(t0)
	pool := testenv.DB(t)
	l, err := meterledger.New(pool, meterledger.Config{Schema: testenv.SchemaOf(pool), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.EnsurePartitions(context.Background(), clk.Now()); err != nil {
		t.Fatal(err)
	}
	return bundle{l: l, clk: clk, pool: pool}
}

func mev(cust, meter string, value int64, ts time.Time) event.MeterEvent {
	return event.MeterEvent{EventName: meter, StripeCustomerID: cust, Value: value, Timestamp: ts, CustomerID: "c_" + cust}
}

func req(ev event.MeterEvent, owner string) meterledger.Request {
	return meterledger.Request{Event: ev, Identifier: ev.Identifier("test"), Owner: owner, Lease: 30 * time.Second, MessageID: "1-0"}
}

func (b bundle) reserve(t *testing.T, reqs ...meterledger.Request) []meterledger.Claim {
	t.Helper()
	c, err := b.l.Reserve(context.Background(), reqs)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (b bundle) one(t *testing.T, r meterledger.Request) meterledger.Claim {
	t.Helper()
	return b.reserve(t, r)[0]
}

func (b bundle) finish(t *testing.T, outs ...meterledger.Outcome) []bool {
	t.Helper()
	rec, err := b.l.Finish(context.Background(), outs)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func (b bundle) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// witness records what the ledger tells it.
type witness struct {
	mu   sync.Mutex
	seqs []int64
}

func (w *witness) Writer() string { return "test-writer" }
func (w *witness) Committed(seq int64) {
	w.mu.Lock()
	w.seqs = append(w.seqs, seq)
	w.mu.Unlock()
}
func (w *witness) last() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.seqs) == 0 {
		return 0
	}
	return w.seqs[len(w.seqs)-1]
}

// The life of an event, through every outcome, and what Reserve says at
// each step: partial batch, reclaim while in flight, timeouts.
func TestReserveFinishTransitions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := &witness{}
	b.l.SetWitness(w)
	ctx := context.Background()
	e := mev("cus_1", "api_requests", 3, t0.Add(-time.Minute))

	c := b.one(t, req(e, "A"))
	if c.Decision != meterledger.Acquired || c.Record.Epoch != 1 || c.Record.Status != meterledger.StatusSending ||
		c.Record.LeaseOwner != "A" || !c.Record.FirstSentAt.Equal(t0) || c.Record.Value != 3 || c.Record.CustomerID != "c_cus_1" {
		t.Fatalf("first reserve: %+v", c)
	}
	if got, _ := b.l.Get(ctx, c.Record.Key); got != c.Record {
		t.Fatalf("Get %+v, want %+v", got, c.Record)
	}
	// Reclaim while in flight: another consumer leaves it alone.
	if c2 := b.one(t, req(e, "B")); c2.Decision != meterledger.Busy {
		t.Fatalf("second reserve while A's lease is live: %v", c2.Decision)
	}
	// The heartbeat keeps it A's past the first lease.
	b.clk.Advance(20 * time.Second)
	if lost, err := b.l.ExtendMany(ctx, []meterledger.Hold{c.Hold()}, 30*time.Second); err != nil || lost[0] {
		t.Fatalf("extend: %v %v", lost, err)
	}
	b.clk.Advance(20 * time.Second)
	if c2 := b.one(t, req(e, "B")); c2.Decision != meterledger.Busy {
		t.Fatalf("extended lease: %v", c2.Decision)
	}
	// A times out at Stripe: releases. B re-sends under the same identifier.
	if rec := b.finish(t, meterledger.Outcome{Hold: c.Hold(), Result: meterledger.Release, Reason: "timeout"}); !rec[0] {
		t.Fatal("release not recorded")
	}
	if w.last() != 0 {
		t.Fatal("a release (no ack follows) bumped the witness")
	}
	c3 := b.one(t, req(e, "B"))
	if c3.Decision != meterledger.TakenOver || c3.Record.Epoch != 2 || c3.Record.Attempts != 2 || c3.Record.LastError != "timeout" ||
		!c3.Record.FirstSentAt.Equal(c.Record.FirstSentAt) || c3.Record.Identifier != c.Record.Identifier {
		t.Fatalf("takeover after release: %+v", c3)
	}
	// Stripe says the identifier exists: delivered.
	if rec := b.finish(t, meterledger.Outcome{Hold: c3.Hold(), Result: meterledger.Delivered}); !rec[0] {
		t.Fatal("delivery not recorded")
	}
	got, _ := b.l.Get(ctx, c.Record.Key)
	if got.Status != meterledger.StatusDelivered || !got.DeliveredAt.Equal(b.clk.Now()) || got.LeaseOwner != "" || got.LastError != "" {
		t.Fatalf("after delivery: %+v", got)
	}
	if w.last() != 1 || b.count(t, `SELECT seq FROM ledger_witness WHERE writer = 'test-writer'`) != 1 {
		t.Fatalf("the delivery did not bump the witness: %v", w.seqs)
	}
	// Partial batch, AOF rollback, XAUTOCLAIM: every later delivery acks.
	for _, owner := range []string{"A", "B", "C"} {
		if c := b.one(t, req(e, owner)); c.Decision != meterledger.AlreadyDelivered || c.Record.Status != meterledger.StatusDelivered {
			t.Fatalf("redelivery to %s: %v", owner, c.Decision)
		}
	}
	// The same event id re-published with another value is not this event.
	withID := mev("cus_2", "api_requests", 5, t0)
	withID.EventID = "req-1"
	c4 := b.one(t, req(withID, "A"))
	b.finish(t, meterledger.Outcome{Hold: c4.Hold(), Result: meterledger.Delivered})
	changed := withID
	changed.Value = 6
	if c := b.one(t, req(changed, "A")); c.Decision != meterledger.Conflict || !strings.Contains(c.Reason, "value 5") {
		t.Fatalf("same event id, other value: %v %q", c.Decision, c.Reason)
	}
	// Failed and parked outcomes: terminal, with their reason.
	f := mev("cus_3", "no_such_meter", 1, t0)
	cf := b.one(t, req(f, "A"))
	if _, err := b.l.Finish(ctx, []meterledger.Outcome{{Hold: cf.Hold(), Result: meterledger.Failed}}); err == nil {
		t.Fatal("a failure without a reason accepted")
	}
	p := mev("cus_4", "api_requests", 1, t0)
	cp := b.one(t, req(p, "A"))
	if rec := b.finish(t, meterledger.Outcome{Hold: cf.Hold(), Result: meterledger.Failed, Reason: "no such meter"},
		meterledger.Outcome{Hold: cp.Hold(), Result: meterledger.Park, Reason: "idempotency mismatch"}); !rec[0] || !rec[1] {
		t.Fatalf("failed/park: %v", rec)
	}
	for _, x := range []struct {
		e      event.MeterEvent
		reason string
	}{{f, "no such meter"}, {p, "idempotency mismatch"}} {
		if c := b.one(t, req(x.e, "B")); c.Decision != meterledger.AlreadyTerminal || c.Reason != x.reason {
			t.Fatalf("after a terminal outcome: %v %q", c.Decision, c.Reason)
		}
	}
	counts, err := b.l.Counts(ctx, t0.Add(-time.Hour), t0.Add(time.Hour))
	if err != nil || counts[meterledger.StatusDelivered] != 2 || counts[meterledger.StatusFailed] != 1 || counts[meterledger.StatusParked] != 1 {
		t.Fatalf("counts %v %v", counts, err)
	}
	if n := b.count(t, `SELECT count(*) FROM meter_inflight`); n != 0 {
		t.Fatalf("%d slots left after every event ended", n)
	}
}

// An event recorded as delivered is never sent again, at any age Stripe
// still takes it: well past Stripe's 24 h, up to the 35 days. Past them
// (and past the partition's life) Stripe refuses it anyway.
func TestDeliveredNeverResentAtAnyAge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e := mev("cus_1", "api_requests", 3, t0)
	c := b.one(t, req(e, "A"))
	b.finish(t, meterledger.Outcome{Hold: c.Hold(), Result: meterledger.Delivered})
	for _, d := range []time.Duration{time.Hour, 25 * time.Hour, 7 * 24 * time.Hour, 35*24*time.Hour - time.Minute} {
		b.clk.Set(t0.Add(d))
		if _, err := b.l.EnsurePartitions(context.Background(), b.clk.Now()); err != nil {
			t.Fatal(err)
		}
		if c := b.one(t, req(e, "B")); c.Decision != meterledger.AlreadyDelivered {
			t.Fatalf("%s later: %v", d, c.Decision)
		}
	}
	b.clk.Set(t0.Add(35*24*time.Hour + time.Minute))
	if c := b.one(t, req(e, "B")); c.Decision != meterledger.AlreadyDelivered {
		t.Fatalf("past 35 days, the row still there: %v", c.Decision)
	}
	if n := b.count(t, `SELECT count(*) FROM meter_events WHERE status = 'delivered'`); n != 1 {
		t.Fatalf("%d rows", n)
	}
}

// An unknown outcome is re-sent only while Stripe still guards the
// identifier: taken over inside the safe window of the first attempt,
// parked past it, with a reason for the alert, and never sent after.
func TestTakeoverInsideTheWindowParkedPastIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := &witness{}
	b.l.SetWitness(w)
	e := mev("cus_1", "api_requests", 3, t0)
	c := b.one(t, req(e, "A")) // A is SIGKILLed after sending
	b.clk.Advance(31 * time.Second)
	c2 := b.one(t, req(e, "B"))
	if c2.Decision != meterledger.TakenOver || c2.Record.Epoch != 2 {
		t.Fatalf("after A's lease: %v", c2.Decision)
	}
	b.finish(t, meterledger.Outcome{Hold: c2.Hold(), Result: meterledger.Release, Reason: "Stripe 503"})
	b.clk.Set(c.Record.FirstSentAt.Add(23*time.Hour - time.Second))
	c3 := b.one(t, req(e, "C"))
	if c3.Decision != meterledger.TakenOver || c3.Record.Attempts != 3 {
		t.Fatalf("just inside the window: %v", c3.Decision)
	}
	b.finish(t, meterledger.Outcome{Hold: c3.Hold(), Result: meterledger.Release, Reason: "Stripe 503"})
	b.clk.Set(c.Record.FirstSentAt.Add(25 * time.Hour)) // the 25 h gap
	c4 := b.one(t, req(e, "D"))
	if c4.Decision != meterledger.Parked || c4.Record.Status != meterledger.StatusParked ||
		!strings.Contains(c4.Record.LastError, "unknown outcome older than Stripe's identifier window: not re-sent") {
		t.Fatalf("past the window: %v %+v", c4.Decision, c4.Record)
	}
	if w.last() != 1 {
		t.Fatalf("a park (an ack follows) did not bump the witness: %v", w.seqs)
	}
	if c5 := b.one(t, req(e, "E")); c5.Decision != meterledger.AlreadyTerminal || c5.Reason != c4.Record.LastError {
		t.Fatalf("after the park: %v", c5.Decision)
	}
	if n := b.count(t, `SELECT count(*) FROM meter_inflight`); n != 0 {
		t.Fatal("a parked event kept its slot")
	}
}

// Suspect (a rollback not yet repaired): a new event older than the safe
// window is held — no row, no slot, not sent; a recent one is sent.
func TestSuspectHoldsOldNewEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := mev("cus_1", "api_requests", 3, t0.Add(-30*time.Hour))
	recent := mev("cus_2", "api_requests", 3, t0.Add(-time.Hour))
	r1, r2 := req(old, "A"), req(recent, "A")
	r1.Suspect, r2.Suspect = true, true
	cs := b.reserve(t, r1, r2)
	if cs[0].Decision != meterledger.Held || !strings.Contains(cs[0].Reason, "rollback") || cs[1].Decision != meterledger.Acquired {
		t.Fatalf("suspect: %v %q, %v", cs[0].Decision, cs[0].Reason, cs[1].Decision)
	}
	if n := b.count(t, `SELECT count(*) FROM meter_events WHERE identifier = $1`, r1.Identifier); n != 0 {
		t.Fatal("a held event was written")
	}
	// Repaired: the same delivery is a real backfill, sent.
	r1.Suspect = false
	if c := b.one(t, r1); c.Decision != meterledger.Acquired {
		t.Fatalf("after the repair: %v", c.Decision)
	}
	// Stripe would refuse it: not sent, nothing written.
	tooOld := mev("cus_3", "api_requests", 1, t0.Add(-36*24*time.Hour))
	if c := b.one(t, req(tooOld, "A")); c.Decision != meterledger.OutsideWindow {
		t.Fatalf("36 days old: %v", c.Decision)
	}
}

// A holder with an old epoch can neither finish, release nor extend, and
// freeing nothing of the new holder's slot.
func TestFencing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	e := mev("cus_1", "api_requests", 3, t0)
	a := b.one(t, req(e, "A"))
	b.clk.Advance(31 * time.Second) // A stalls (GC, a slow Stripe call)
	bb := b.one(t, req(e, "B"))
	if bb.Decision != meterledger.TakenOver {
		t.Fatalf("takeover: %v", bb.Decision)
	}
	for _, r := range []meterledger.Result{meterledger.Delivered, meterledger.Release, meterledger.Failed} {
		if rec := b.finish(t, meterledger.Outcome{Hold: a.Hold(), Result: r, Reason: "x"}); rec[0] {
			t.Fatalf("stale %v recorded", r)
		}
	}
	lost, err := b.l.ExtendMany(ctx, []meterledger.Hold{a.Hold(), bb.Hold()}, time.Minute)
	if err != nil || !lost[0] || lost[1] {
		t.Fatalf("extend: %v %v", lost, err)
	}
	if n := b.count(t, `SELECT count(*) FROM meter_inflight WHERE token = $1`, bb.Hold().SlotToken); n != 1 {
		t.Fatal("the stale holder's finish freed the new holder's slot")
	}
	if rec := b.finish(t, meterledger.Outcome{Hold: bb.Hold(), Result: meterledger.Delivered}); !rec[0] {
		t.Fatal("B's delivery not recorded")
	}
	// A finishing after B is not lost (nothing to cancel) and not recorded.
	if lost, _ := b.l.ExtendMany(ctx, []meterledger.Hold{a.Hold()}, time.Minute); lost[0] {
		t.Fatal("a finished event reported lost")
	}
}

// Every epoch is above the ledger's epoch floor (raised after a rollback):
// new rows start past it, takeovers jump past it.
func TestEpochFloor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	early := b.one(t, req(mev("cus_1", "api_requests", 1, t0), "A"))
	if _, err := b.pool.Exec(ctx, `UPDATE ledger_fence SET epoch_floor = 1000`); err != nil {
		t.Fatal(err)
	}
	if c := b.one(t, req(mev("cus_2", "api_requests", 1, t0), "A")); c.Record.Epoch != 1001 {
		t.Fatalf("new row epoch %d, want 1001", c.Record.Epoch)
	}
	b.clk.Advance(time.Minute)
	c := b.one(t, req(mev("cus_1", "api_requests", 1, t0), "B"))
	if c.Decision != meterledger.TakenOver || c.Record.Epoch != 1001 {
		t.Fatalf("takeover of epoch %d: %v epoch %d, want 1001", early.Record.Epoch, c.Decision, c.Record.Epoch)
	}
	if rec := b.finish(t, meterledger.Outcome{Hold: early.Hold(), Result: meterledger.Delivered}); rec[0] {
		t.Fatal("a holder from below the floor finished")
	}
}

func TestConfigAndRequestChecks(t *testing.T) {
	t.Parallel()
	pool := testenv.DB(t)
	if _, err := meterledger.New(pool, meterledger.Config{Schema: testenv.SchemaOf(pool), SafeWindow: 24 * time.Hour}); err == nil {
		t.Fatal("a safe window as long as Stripe's accepted")
	}
	b := setup(t)
	bad := req(mev("cus_1", "api_requests", 1, t0), "")
	if _, err := b.l.Reserve(context.Background(), []meterledger.Request{bad}); err == nil {
		t.Fatal("a request without an owner accepted")
	}
	bad = req(mev("cus_1", "api_requests", 1, t0), "A")
	bad.Identifier = fmt.Sprintf("%0101d", 1)
	if _, err := b.l.Reserve(context.Background(), []meterledger.Request{bad}); err == nil {
		t.Fatal("a 101-byte identifier accepted")
	}
}
