package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

type bundle struct {
	l   *ledger.Ledger
	clk *clock.Sim
}

func setup(t *testing.T) bundle {
	t.Helper()
	clk := clock.NewSim(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	pool := testenv.DB(t)
	return bundle{l: ledger.New(pool, testenv.SchemaOf(pool), clk), clk: clk}
}

func ev(cust string, amount int64) event.Event {
	return event.Event{CustomerID: cust, StripeCustomerID: "cus_" + cust, AmountCents: amount, BillingPeriod: "2026-11", Currency: "usd"}
}

func req(e event.Event, owner string) ledger.ReserveRequest {
	return ledger.ReserveRequest{Event: e, IdempotencyKey: e.Key("test"), Owner: owner, Lease: 30 * time.Second, MessageID: "1-0"}
}

func TestReserveTransitions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	e := ev("c1", 2500)

	c, err := b.l.Reserve(ctx, req(e, "A"))
	if err != nil || c.Decision != ledger.Acquired || c.Record.Epoch != 1 || c.Record.Status != ledger.StatusPending {
		t.Fatalf("first reserve: %+v %v", c, err)
	}
	// A live lease held by A: B must leave it alone.
	c2, err := b.l.Reserve(ctx, req(e, "B"))
	if err != nil || c2.Decision != ledger.Busy {
		t.Fatalf("second reserve while A's lease is live: %v %v", c2.Decision, err)
	}
	// The heartbeat extends A's lease.
	b.clk.Advance(20 * time.Second)
	if err := b.l.Extend(ctx, c.Record, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	b.clk.Advance(20 * time.Second) // 40 s after reserve, 20 s after extend: still live
	if c2, _ := b.l.Reserve(ctx, req(e, "B")); c2.Decision != ledger.Busy {
		t.Fatalf("extended lease should still be live, got %v", c2.Decision)
	}
	// A dies; the lease expires; B takes over with epoch 2.
	b.clk.Advance(31 * time.Second)
	c3, err := b.l.Reserve(ctx, req(e, "B"))
	if err != nil || c3.Decision != ledger.TakenOver || c3.Record.Epoch != 2 || c3.Record.Attempts != 2 {
		t.Fatalf("takeover: %+v %v", c3, err)
	}
	if !c3.Record.FirstAttemptAt.Equal(c.Record.FirstAttemptAt) {
		t.Fatal("takeover must keep the first attempt time (the safe key window is measured from it)")
	}
	// A wakes up: every write with epoch 1 is fenced out.
	if err := b.l.Extend(ctx, c.Record, time.Minute); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Fatalf("stale extend: %v", err)
	}
	if _, err := b.l.Finish(ctx, c.Record, ledger.Outcome{Status: ledger.StatusCharged, ChargeID: "ch_A"}); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Fatalf("stale finish: %v", err)
	}
	if err := b.l.Release(ctx, c.Record, "timeout"); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Fatalf("stale release: %v", err)
	}
	// B finishes.
	r, err := b.l.Finish(ctx, c3.Record, ledger.Outcome{Status: ledger.StatusCharged, ChargeID: "ch_B"})
	if err != nil || r.Status != ledger.StatusCharged || r.ChargeID != "ch_B" || r.LeaseOwner != "" {
		t.Fatalf("finish: %+v %v", r, err)
	}
	// Terminal: every later delivery is told so.
	c4, err := b.l.Reserve(ctx, req(e, "C"))
	if err != nil || c4.Decision != ledger.AlreadyTerminal || c4.Record.ChargeID != "ch_B" {
		t.Fatalf("after charge: %+v %v", c4, err)
	}
	got, err := b.l.Get(ctx, ledger.EventKey(e))
	if err != nil || got.ChargeID != "ch_B" || got.Epoch != 2 {
		t.Fatalf("get: %+v %v", got, err)
	}
}

func TestReleaseThenTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	e := ev("c1", 100)
	c, _ := b.l.Reserve(ctx, req(e, "A"))
	if err := b.l.Release(ctx, c.Record, "stripe timeout"); err != nil {
		t.Fatal(err)
	}
	// Released: the next delivery takes over at once, no need to wait for expiry.
	c2, err := b.l.Reserve(ctx, req(e, "B"))
	if err != nil || c2.Decision != ledger.TakenOver || c2.Record.LastError != "stripe timeout" {
		t.Fatalf("%+v %v", c2, err)
	}
}

func TestDeclinedAndFailed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for _, st := range []ledger.Status{ledger.StatusDeclined, ledger.StatusFailed} {
		e := ev("c_"+string(st), 100)
		c, _ := b.l.Reserve(ctx, req(e, "A"))
		r, err := b.l.Finish(ctx, c.Record, ledger.Outcome{Status: st, Error: "card_declined"})
		if err != nil || r.Status != st || r.ChargeID != "" || r.LastError != "card_declined" {
			t.Fatalf("%s: %+v %v", st, r, err)
		}
		if c2, _ := b.l.Reserve(ctx, req(e, "B")); c2.Decision != ledger.AlreadyTerminal {
			t.Fatalf("%s must be terminal", st)
		}
	}
	c, _ := b.l.Reserve(ctx, req(ev("c_x", 1), "A"))
	if _, err := b.l.Finish(ctx, c.Record, ledger.Outcome{Status: ledger.StatusCharged}); err == nil {
		t.Fatal("charged without a charge id must be refused")
	}
}

func TestConflictingEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.l.Reserve(ctx, req(ev("c1", 100), "A")); err != nil {
		t.Fatal(err)
	}
	c, err := b.l.Reserve(ctx, req(ev("c1", 999), "B"))
	if err != nil || c.Decision != ledger.Conflict || c.Record.AmountCents != 100 {
		t.Fatalf("%+v %v", c, err)
	}
	// Also once the row is terminal: a different event is never acked as
	// "already billed".
	c0, _ := b.l.Reserve(ctx, req(ev("c2", 100), "A"))
	if _, err := b.l.Finish(ctx, c0.Record, ledger.Outcome{Status: ledger.StatusCharged, ChargeID: "ch_c2"}); err != nil {
		t.Fatal(err)
	}
	if c, _ := b.l.Reserve(ctx, req(ev("c2", 100), "B")); c.Decision != ledger.AlreadyTerminal {
		t.Fatalf("same event again: %v", c.Decision)
	}
	if c, _ := b.l.Reserve(ctx, req(ev("c2", 101), "B")); c.Decision != ledger.Conflict {
		t.Fatalf("different amount on a charged row: %v", c.Decision)
	}
}

// Two goroutines reserving the same key: exactly one wins.
func TestConcurrentReserveOneWinner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for round := 0; round < 20; round++ {
		e := ev(fmt.Sprintf("c%d", round), 100)
		var wg sync.WaitGroup
		results := make([]ledger.Decision, 2)
		errs := make([]error, 2)
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := b.l.Reserve(ctx, req(e, fmt.Sprintf("w%d", i)))
				results[i], errs[i] = c.Decision, err
			}()
		}
		wg.Wait()
		if errs[0] != nil || errs[1] != nil {
			t.Fatal(errs)
		}
		won := 0
		for _, d := range results {
			if d.MayCharge() {
				won++
			} else if d != ledger.Busy {
				t.Fatalf("loser got %v, want busy", d)
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d winners (%v)", round, won, results)
		}
	}
}

// A spend cap is never exceeded under 50 concurrent reservations, and a
// declined charge gives its reservation back.
func TestSpendCapUnderConcurrency(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.l.SetCap(ctx, "2026-11", 10_000); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	acquired, capped := 0, 0
	var acquiredRecs []ledger.Record
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := b.l.Reserve(ctx, req(ev(fmt.Sprintf("c%d", i), 700), "A"))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil && c.Decision == ledger.Acquired:
				acquired++
				acquiredRecs = append(acquiredRecs, c.Record)
			case errors.Is(err, ledger.ErrSpendCap):
				capped++
			default:
				t.Errorf("unexpected: %v %v", c.Decision, err)
			}
		}()
	}
	wg.Wait()
	if acquired != 14 || capped != 36 { // 14 × 700 = 9,800 ≤ 10,000 < 15 × 700
		t.Fatalf("acquired %d capped %d, want 14 and 36", acquired, capped)
	}
	cp, err := b.l.Cap(ctx, "2026-11")
	if err != nil || cp.ReservedCents != 9800 {
		t.Fatalf("cap %+v %v", cp, err)
	}
	counts, _ := b.l.Counts(ctx)
	if counts[ledger.StatusPending] != 14 {
		t.Fatalf("a capped reservation must write no row: %v", counts)
	}
	// A decline releases its reservation; a charge keeps it.
	if _, err := b.l.Finish(ctx, acquiredRecs[0], ledger.Outcome{Status: ledger.StatusDeclined, Error: "card_declined"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.l.Finish(ctx, acquiredRecs[1], ledger.Outcome{Status: ledger.StatusCharged, ChargeID: "ch_1"}); err != nil {
		t.Fatal(err)
	}
	if cp, _ := b.l.Cap(ctx, "2026-11"); cp.ReservedCents != 9100 {
		t.Fatalf("after decline: reserved %d, want 9100", cp.ReservedCents)
	}
	// The cap cannot be lowered below what is reserved.
	if _, err := b.l.SetCap(ctx, "2026-11", 5000); !errors.Is(err, ledger.ErrCapBelowReserved) {
		t.Fatalf("lowering below reserved: %v", err)
	}
	// Raising it makes room again (the replay path for spend_cap dead letters).
	if _, err := b.l.SetCap(ctx, "2026-11", 20_000); err != nil {
		t.Fatal(err)
	}
	if c, err := b.l.Reserve(ctx, req(ev("c_late", 700), "A")); err != nil || c.Decision != ledger.Acquired {
		t.Fatalf("after raise: %v %v", c.Decision, err)
	}
}

func TestRequireCap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := req(ev("c1", 100), "A")
	r.RequireCap = true
	if _, err := b.l.Reserve(ctx, r); !errors.Is(err, ledger.ErrNoCap) {
		t.Fatalf("want ErrNoCap, got %v", err)
	}
	r.RequireCap = false
	if c, err := b.l.Reserve(ctx, r); err != nil || c.Decision != ledger.Acquired || c.Record.CapReservedCents != 0 {
		t.Fatalf("without cap: %+v %v", c, err)
	}
}

func TestLookupAndReads(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var keys []ledger.Key
	var idem []string
	for i := range 5 {
		e := ev(fmt.Sprintf("c%d", i), 100)
		c, err := b.l.Reserve(ctx, req(e, "A"))
		if err != nil {
			t.Fatal(err)
		}
		if i < 3 {
			if _, err := b.l.Finish(ctx, c.Record, ledger.Outcome{Status: ledger.StatusCharged, ChargeID: fmt.Sprintf("ch_%d", i)}); err != nil {
				t.Fatal(err)
			}
		}
		keys = append(keys, ledger.EventKey(e))
		idem = append(idem, e.Key("test"))
	}
	keys = append(keys, ledger.Key{CustomerID: "nobody", BillingPeriod: "2026-11"})
	m, err := b.l.Lookup(ctx, keys)
	if err != nil || len(m) != 5 || m[keys[0]].ChargeID != "ch_0" || m[keys[4]].Status != ledger.StatusPending {
		t.Fatalf("lookup: %d %v", len(m), err)
	}
	bk, err := b.l.ByIdempotencyKeys(ctx, idem[:2])
	if err != nil || len(bk) != 2 || bk[idem[1]].ChargeID != "ch_1" {
		t.Fatalf("by key: %v %v", bk, err)
	}
	n := 0
	if err := b.l.ScanCharged(ctx, b.clk.Now().Add(-time.Minute), b.clk.Now().Add(time.Minute), func(ledger.Record) error { n++; return nil }); err != nil || n != 3 {
		t.Fatalf("scan charged: %d %v", n, err)
	}
	b.clk.Advance(time.Hour)
	n = 0
	if err := b.l.ScanStuckPending(ctx, b.clk.Now().Add(-30*time.Minute), func(ledger.Record) error { n++; return nil }); err != nil || n != 2 {
		t.Fatalf("stuck pending: %d %v", n, err)
	}
	if _, err := b.l.Get(ctx, ledger.Key{CustomerID: "nobody", BillingPeriod: "x"}); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("get missing: %v", err)
	}
}

func TestExtendMany(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var recs []ledger.Record
	for i := range 3 {
		c, err := b.l.Reserve(ctx, req(ev(fmt.Sprintf("c%d", i), 100), "A"))
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, c.Record)
	}
	// c1 is taken over by B after its lease expires: A's heartbeat must report it lost.
	b.clk.Advance(31 * time.Second)
	if c, err := b.l.Reserve(ctx, req(ev("c1", 100), "B")); err != nil || c.Decision != ledger.TakenOver {
		t.Fatalf("takeover: %v %v", c.Decision, err)
	}
	// c2 has just finished: not lost, nothing to cancel.
	if _, err := b.l.Finish(ctx, recs[2], ledger.Outcome{Status: ledger.StatusCharged, ChargeID: "ch_c2"}); err != nil {
		t.Fatal(err)
	}
	lost, err := b.l.ExtendMany(ctx, recs, time.Minute)
	if err != nil || len(lost) != 1 || lost[0].CustomerID != "c1" {
		t.Fatalf("lost %v %v, want only c1", lost, err)
	}
	m, _ := b.l.Lookup(ctx, []ledger.Key{recs[0].Key})
	if !m[recs[0].Key].LeaseExpiresAt.Equal(b.clk.Now().Add(time.Minute)) {
		t.Fatalf("lease not extended: %v", m[recs[0].Key].LeaseExpiresAt)
	}
}

func TestReserveNewAndFinishCharged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.l.SetCap(ctx, "2026-12", 1_000_000); err != nil {
		t.Fatal(err)
	}
	existing := ev("c_old", 100)
	if _, err := b.l.Reserve(ctx, req(existing, "X")); err != nil {
		t.Fatal(err)
	}
	capped := ev("c_cap", 100)
	capped.BillingPeriod = "2026-12"
	var reqs []ledger.ReserveRequest
	for i := range 5 {
		reqs = append(reqs, req(ev(fmt.Sprintf("c%d", i), 100), "A"))
	}
	reqs = append(reqs, req(ev("c0", 100), "A"), req(existing, "A"), req(capped, "A"))
	got, err := b.l.ReserveNew(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	// Only the five new, uncapped keys: the duplicate, the existing row and
	// the capped period are left to Reserve.
	if len(got) != 5 {
		t.Fatalf("reserved %d, want 5", len(got))
	}
	for k, r := range got {
		if r.Epoch != 1 || r.LeaseOwner != "A" || r.Status != ledger.StatusPending || !r.LeaseLive(b.clk.Now()) {
			t.Fatalf("%s: %+v", k, r)
		}
	}
	if c, _ := b.l.Reserve(ctx, req(capped, "A")); c.Decision != ledger.Acquired || c.Record.CapReservedCents != 100 {
		t.Fatalf("capped period through Reserve: %+v", c)
	}
	// Another holder takes c1 over after expiry: c1's batch finish is fenced out.
	b.clk.Advance(31 * time.Second)
	if c, _ := b.l.Reserve(ctx, req(ev("c1", 100), "B")); c.Decision != ledger.TakenOver {
		t.Fatalf("takeover: %v", c.Decision)
	}
	var cs []ledger.Charged
	for i := range 5 {
		k := ledger.Key{CustomerID: fmt.Sprintf("c%d", i), BillingPeriod: "2026-11"}
		cs = append(cs, ledger.Charged{Record: got[k], ChargeID: fmt.Sprintf("ch_%d", i)})
	}
	done, err := b.l.FinishCharged(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	if len(done) != 4 || done[ledger.Key{CustomerID: "c1", BillingPeriod: "2026-11"}] {
		t.Fatalf("recorded %v: want all but the fenced-out c1", done)
	}
	counts, _ := b.l.Counts(ctx)
	if counts[ledger.StatusCharged] != 4 {
		t.Fatalf("counts %v", counts)
	}
}
