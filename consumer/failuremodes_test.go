package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

// naiveMonitor is the seed's "stuck message" monitor: XAUTOCLAIM anything
// idle longer than minIdle to consumer-B, and hand it to consumer-B.
func naiveMonitor(ctx context.Context, t *testing.T, b *bundle, minIdle time.Duration, handle func(redis.XMessage)) *atomic.Int64 {
	var claimed atomic.Int64
	go func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			msgs, _, err := b.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{Stream: b.stream, Group: b.group,
				Consumer: "consumer-B", MinIdle: minIdle, Start: "0-0", Count: 10}).Result()
			if err != nil {
				continue
			}
			claimed.Add(int64(len(msgs)))
			for _, m := range msgs {
				handle(m)
			}
		}
	}()
	return &claimed
}

// Failure mode 1, reclaim while in flight: Stripe takes 3× the monitor's
// min-idle. The heartbeat keeps resetting the PEL entry's idle time, so the
// monitor never even sees it as stuck.
func TestReclaimWhileInFlightHeartbeatKeepsEntry(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	const minIdle = 400 * time.Millisecond
	if err := b.sim.SetFaults(stripesim.Faults{Latency: stripesim.Latency{Fixed: 3 * minIdle}}); err != nil {
		t.Fatal(err)
	}
	e := ev(1)
	b.add(t, e)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	procB := processor(t, b.config(t, "consumer-B"))
	claimed := naiveMonitor(ctx, t, b, minIdle, func(m redis.XMessage) { _, _ = procB.Process(ctx, b.stream, m) })

	cfg := b.config(t, "consumer-A")
	cfg.Lease = 300 * time.Millisecond // heartbeat every 100 ms, a quarter of the monitor's min-idle
	start(t, cfg)
	testenv.Eventually(t, 10*time.Second, func() bool { return b.status(e) == ledger.StatusCharged && b.pending(t) == 0 },
		"charged and acked")
	if n := claimed.Load(); n != 0 {
		t.Errorf("the monitor reclaimed %d entries from a live consumer", n)
	}
	if n := b.charges(e); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}

// With the heartbeat switched off the monitor does reclaim the entry and a
// second consumer does process it, and still nobody charges twice: the ledger
// lease makes consumer-B back off (and, once the lease has expired, the
// content-hash idempotency key makes Stripe return the same charge).
func TestReclaimWhileInFlightWithoutHeartbeat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		lease time.Duration
	}{
		{"ledger lease outlives the call", 5 * time.Second},
		{"ledger lease expires mid-call", 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, opts{})
			const minIdle = 200 * time.Millisecond
			if err := b.sim.SetFaults(stripesim.Faults{Latency: stripesim.Latency{Fixed: 3 * minIdle}}); err != nil {
				t.Fatal(err)
			}
			evs := []event.Event{ev(1), ev(2), ev(3)}
			b.add(t, evs...)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cfgB := b.config(t, "consumer-B")
			cfgB.Test.DisableHeartbeat = true
			cfgB.Lease = tc.lease
			procB := processor(t, cfgB)
			var mu sync.Mutex
			outcomes := map[consumer.Outcome]int{}
			claimed := naiveMonitor(ctx, t, b, minIdle, func(m redis.XMessage) {
				out, _ := procB.Process(ctx, b.stream, m)
				mu.Lock()
				outcomes[out]++
				mu.Unlock()
			})
			cfg := b.config(t, "consumer-A")
			cfg.Test.DisableHeartbeat = true
			cfg.Lease = tc.lease
			cfg.Workers = 3
			start(t, cfg)
			testenv.Eventually(t, 20*time.Second, func() bool {
				n, _ := b.ledger.Counts(context.Background())
				return n[ledger.StatusCharged] == 3 && b.pending(t) == 0
			}, "all charged and acked")
			if claimed.Load() == 0 {
				t.Fatal("the monitor never reclaimed anything: the test did not reproduce failure mode 1")
			}
			for _, e := range evs {
				if n := b.charges(e); n != 1 {
					t.Errorf("%s: %d charges, want 1", e.CustomerID, n)
				}
			}
			if d := b.sim.Duplicates(); len(d) != 0 {
				t.Fatalf("duplicates at Stripe: %+v", d)
			}
			mu.Lock()
			defer mu.Unlock()
			t.Logf("consumer-B outcomes: %v (claimed %d)", outcomes, claimed.Load())
		})
	}
}

// failAt wraps the Stripe adapter so that the nth charge's reply is lost
// after Stripe committed it (the emulator's commit-then-drop).
type failAt struct {
	consumer.Stripe
	sim   *stripesim.Server
	n     int64
	calls atomic.Int64
}

func (f *failAt) Charge(ctx context.Context, req stripeapi.ChargeRequest) (stripeapi.Charge, error) {
	if f.calls.Add(1) == f.n {
		fl := f.sim.Faults()
		fl.DropNextCharges = 1
		fl.DropHang = true // a real timeout: the client gives up
		_ = f.sim.SetFaults(fl)
		ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		return f.Stripe.Charge(ctx, req)
	}
	return f.Stripe.Charge(ctx, req)
}

// Failure mode 2, partial batch: COUNT 10, the 7th charge times out, the
// batch is taken over by another consumer. Per-event write-before-ack means
// 1–6 were recorded and acked; the takeover re-drives 7–10 only, and the 7th
// (which Stripe did commit) comes back under the same key. Exactly 10 charges.
func TestPartialBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	var evs []event.Event
	for i := range 10 {
		evs = append(evs, ev(i))
	}
	ids := b.add(t, evs...)
	msgs := b.read(t, "consumer-A", 10) // all 10 enter A's PEL at once
	if len(msgs) != 10 {
		t.Fatalf("read %d", len(msgs))
	}
	cfgA := b.config(t, "consumer-A")
	cfgA.Stripe = &failAt{Stripe: b.stripe, sim: b.sim, n: 7}
	procA := processor(t, cfgA)
	ctx := context.Background()
	var outs []consumer.Outcome
	for _, m := range msgs { // A processes the batch in order, as the seed's loop does
		out, _ := procA.Process(ctx, b.stream, m)
		outs = append(outs, out)
	}
	if outs[6] != consumer.OutcomeRetryLater {
		t.Fatalf("7th outcome %v, want retry_later (timeout)", outs[6])
	}
	if got := b.pending(t); got != 1 {
		t.Fatalf("after A: %d pending, want only the 7th", got)
	}
	// Another consumer takes over everything A had (as XAUTOCLAIM would: the
	// whole batch, acked or not), and processes it.
	procB := processor(t, b.config(t, "consumer-B"))
	for _, m := range b.claim(t, "consumer-B", ids...) {
		if _, err := procB.Process(ctx, b.stream, m); err != nil {
			t.Fatal(err)
		}
	}
	// The same ten events delivered once more (a producer retry, a replay):
	// still nothing new.
	b.add(t, evs...)
	for _, m := range b.read(t, "consumer-B", 10) {
		if out, _ := procB.Process(ctx, b.stream, m); out != consumer.OutcomeAlreadyBilled {
			t.Fatalf("redelivery of %s: %v", m.ID, out)
		}
	}
	for _, e := range evs {
		if n := b.charges(e); n != 1 {
			t.Errorf("%s: %d charges, want 1", e.CustomerID, n)
		}
	}
	if got := b.sim.ChargeCreates(); got != 10 {
		t.Fatalf("%d charge creates at Stripe, want 10", got)
	}
	if got := b.pending(t); got != 0 {
		t.Fatalf("%d pending", got)
	}
}

// Commit then drop: Stripe made the charge, the reply never came. The entry
// stays pending; the retry with the same key gets the same charge.
func TestCommitThenDrop(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{noKeepAliv: true})
	if err := b.sim.SetFaults(stripesim.Faults{DropNextCharges: 1}); err != nil {
		t.Fatal(err)
	}
	e := ev(1)
	b.add(t, e)
	msgs := b.read(t, "consumer-A", 1)
	p := processor(t, b.config(t, "consumer-A"))
	out, err := p.Process(context.Background(), b.stream, msgs[0])
	if out != consumer.OutcomeRetryLater || err == nil {
		t.Fatalf("first attempt: %v %v, want retry_later", out, err)
	}
	if b.charges(e) != 1 || b.record(t, e).Status != ledger.StatusPending || b.pending(t) != 1 {
		t.Fatal("the charge should exist, the row stay pending, the entry stay in the PEL")
	}
	out, err = p.Process(context.Background(), b.stream, msgs[0])
	if out != consumer.OutcomeCharged || err != nil {
		t.Fatalf("retry: %v %v", out, err)
	}
	r := b.record(t, e)
	if n := b.charges(e); n != 1 {
		t.Fatalf("%d charges", n)
	}
	if cs := b.sim.Charges(); len(cs) != 1 || cs[0].ID != r.ChargeID {
		t.Fatalf("ledger charge %s does not match Stripe's %+v", r.ChargeID, cs)
	}
	if b.pending(t) != 0 {
		t.Fatal("not acked")
	}
}

// Past Stripe's 24 h key window the key alone no longer protects: the
// takeover looks the charge up by metadata and records it, no second charge.
func TestKeyWindowPassedLooksUpCharge(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	clk := newSimClock(t0)
	b := setup(t, opts{clk: clk, simNow: t0, noKeepAliv: true})
	if err := b.sim.SetFaults(stripesim.Faults{DropNextCharges: 1}); err != nil {
		t.Fatal(err)
	}
	e := ev(1)
	b.add(t, e)
	msgs := b.read(t, "consumer-A", 1)
	cfg := b.config(t, "consumer-A")
	cfg.Clock = clk
	p := processor(t, cfg)
	if out, _ := p.Process(context.Background(), b.stream, msgs[0]); out != consumer.OutcomeRetryLater {
		t.Fatalf("first attempt: %v", out)
	}
	// A day and an hour later (a message stuck in the PEL, then reclaimed).
	clk.Advance(25 * time.Hour)
	b.sim.Advance(25 * time.Hour)
	out, err := p.Process(context.Background(), b.stream, msgs[0])
	if out != consumer.OutcomeCharged || err != nil {
		t.Fatalf("after 25 h: %v %v", out, err)
	}
	if n := b.charges(e); n != 1 {
		t.Fatalf("%d charges after the key window, want 1", n)
	}
	if got := b.sim.ChargeCreates(); got != 1 {
		t.Fatalf("%d charge creates, want 1 (the lookup must find the first)", got)
	}
	if r := b.record(t, e); r.ChargeID != b.sim.Charges()[0].ID {
		t.Fatalf("ledger %s vs stripe %s", r.ChargeID, b.sim.Charges()[0].ID)
	}
}

// Issue 26: a ledger that lost a charged row (a failover to an
// asynchronous replica), and the acked entry coming back a day later (a
// Redis rollback): the new row is attempt 1 and the event carries no
// occurred_at, but its stream entry id says it was added more than the
// safe window ago, so the consumer asks Stripe first and records the
// charge it finds instead of charging under a key Stripe has forgotten.
func TestAnEntryOlderThanTheKeyWindowLooksUpFirst(t *testing.T) {
	t.Parallel()
	t0 := time.Now().UTC() // entry ids are the wall clock's
	clk := newSimClock(t0)
	b := setup(t, opts{clk: clk, simNow: t0})
	e := ev(1)
	b.add(t, e)
	msgs := b.read(t, "consumer-A", 1)
	// Redis as an AOF rollback will bring it back: the entry pending.
	dump, err := b.rdb.Dump(context.Background(), b.stream).Result()
	if err != nil {
		t.Fatal(err)
	}
	cfg := b.config(t, "consumer-A")
	cfg.Clock = clk
	p := processor(t, cfg)
	if out, err := p.Process(context.Background(), b.stream, msgs[0]); out != consumer.OutcomeCharged || err != nil {
		t.Fatalf("first delivery: %v %v", out, err)
	}
	if _, err := b.pool.Exec(context.Background(), `DELETE FROM billing_records`); err != nil {
		t.Fatal(err)
	}
	if err := b.rdb.RestoreReplace(context.Background(), b.stream, 0, dump).Err(); err != nil {
		t.Fatal(err)
	}
	clk.Advance(25 * time.Hour)
	b.sim.Advance(25 * time.Hour)
	out, err := p.Process(context.Background(), b.stream, msgs[0])
	if out != consumer.OutcomeCharged || err != nil {
		t.Fatalf("the entry back a day later: %v %v", out, err)
	}
	if n, creates := b.charges(e), b.sim.ChargeCreates(); n != 1 || creates != 1 {
		t.Fatalf("%d charges (%d creates) after the entry came back, want 1: the look-up must find the first", n, creates)
	}
	if r := b.record(t, e); r.Status != ledger.StatusCharged || r.ChargeID != b.sim.Charges()[0].ID {
		t.Fatalf("ledger %s %s vs Stripe %s", r.Status, r.ChargeID, b.sim.Charges()[0].ID)
	}
}

// Past the window with the lookup failing: never guess. The row stays
// pending, the entry stays in the PEL, nothing is charged.
func TestKeyWindowLookupFailureLeavesPending(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	clk := newSimClock(t0)
	b := setup(t, opts{clk: clk, simNow: t0, noKeepAliv: true})
	_ = b.sim.SetFaults(stripesim.Faults{DropNextCharges: 1})
	e := ev(1)
	b.add(t, e)
	msgs := b.read(t, "consumer-A", 1)
	cfg := b.config(t, "consumer-A")
	cfg.Clock = clk
	p := processor(t, cfg)
	_, _ = p.Process(context.Background(), b.stream, msgs[0])
	clk.Advance(25 * time.Hour)
	b.sim.Advance(25 * time.Hour)
	_ = b.sim.SetFaults(stripesim.Faults{ErrorRate: 1})
	out, err := p.Process(context.Background(), b.stream, msgs[0])
	if out != consumer.OutcomeRetryLater || err == nil {
		t.Fatalf("%v %v, want retry_later", out, err)
	}
	if b.record(t, e).Status != ledger.StatusPending || b.pending(t) != 1 || b.sim.ChargeCreates() != 1 {
		t.Fatal("a failed lookup must leave the row pending, the entry pending, and charge nothing")
	}
}

func TestDeclinedAndPermanentErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	declined, ok := ev(1), ev(2)
	_ = b.sim.SetFaults(stripesim.Faults{DeclineCustomers: []string{declined.StripeCustomerID}})
	b.add(t, declined, ok)
	start(t, b.config(t, ""))
	testenv.Eventually(t, 10*time.Second, func() bool {
		return b.status(declined).Terminal() && b.status(ok).Terminal() && b.pending(t) == 0
	}, "both recorded and acked")
	if r := b.record(t, declined); r.Status != ledger.StatusDeclined {
		t.Fatalf("declined row: %v", r.Status)
	}
	if r := b.record(t, ok); r.Status != ledger.StatusCharged {
		t.Fatalf("ok row: %v", r.Status)
	}
}

// A restricted key without charge permission: nothing is charged, the entry
// is parked in the dead-letter stream (not retried in a loop), and the row
// stays pending, so replaying the event once the key is fixed charges it.
func TestPermissionErrorParksEventForReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	b.sim.SetKeyPermissions("rk_test_readonly", "charges_read")
	sc, err := stripeapi.New(stripeapi.Config{APIKey: "rk_test_readonly", BaseURL: b.sim.URL(), MaxNetworkRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	e := ev(1)
	b.add(t, e)
	cfg := b.config(t, "")
	cfg.Stripe = sc
	c := start(t, cfg)
	testenv.Eventually(t, 10*time.Second, func() bool { return len(deadLetters(t, b)) == 1 && b.pending(t) == 0 }, "parked")
	dl := deadLetters(t, b)
	if dl[0].Values["reason"] != consumer.ReasonStripeKey {
		t.Fatalf("reason %v", dl[0].Values["reason"])
	}
	if r := b.record(t, e); r.Status != ledger.StatusPending || r.LeaseOwner != "" {
		t.Fatalf("row %s owner %q: must stay pending with its lease released", r.Status, r.LeaseOwner)
	}
	if b.sim.ChargeCreates() != 0 {
		t.Fatal("no charge may be made")
	}
	// The key is fixed; the dead letter is replayed.
	if err := c.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.addRaw(t, map[string]any{"payload": dl[0].Values["payload"]})
	start(t, b.config(t, ""))
	testenv.Eventually(t, 10*time.Second, func() bool { return b.status(e) == ledger.StatusCharged && b.pending(t) == 0 }, "replayed and charged")
	if n := b.charges(e); n != 1 {
		t.Fatalf("%d charges", n)
	}
}

// The key was first used with other parameters and that first attempt did
// charge (its reply was lost): Stripe answers idempotency_error on the retry.
// The outcome is not "failed": the consumer finds the charge and records it.
func TestIdempotencyMismatchFindsEarlierCharge(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{noKeepAliv: true})
	_ = b.sim.SetFaults(stripesim.Faults{DropNextCharges: 1})
	e := ev(1)
	b.add(t, e)
	msgs := b.read(t, "consumer-A", 1)
	cfg := b.config(t, "consumer-A")
	cfg.Description = func(ev event.Event) string { return "old description " + ev.BillingPeriod }
	if out, _ := processor(t, cfg).Process(context.Background(), b.stream, msgs[0]); out != consumer.OutcomeRetryLater {
		t.Fatalf("first attempt: %v", out)
	}
	// A deploy changed the description: same key, different parameters.
	out, err := processor(t, b.config(t, "consumer-A")).Process(context.Background(), b.stream, msgs[0])
	if out != consumer.OutcomeCharged || err != nil {
		t.Fatalf("retry: %v %v", out, err)
	}
	if r := b.record(t, e); r.Status != ledger.StatusCharged || r.ChargeID != b.sim.Charges()[0].ID {
		t.Fatalf("ledger %+v", r)
	}
	if n := b.charges(e); n != 1 || b.pending(t) != 0 {
		t.Fatalf("%d charges, %d pending", n, b.pending(t))
	}
}

func deadLetters(t *testing.T, b *bundle) []redis.XMessage {
	t.Helper()
	msgs, err := b.rdb.XRange(context.Background(), consumer.DeadLetterStream(b.stream), "-", "+").Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return msgs
}

var _ = fmt.Sprint
