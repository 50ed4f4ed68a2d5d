package consumer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// Bad input gets a clear reason and loses nothing: every invalid entry lands
// in <stream>:dead with its original fields and the reason, is acked, and the
// loop goes on to charge the good event behind them.
func TestBadPayloadsGoToDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	p := func(s string) map[string]any { return map[string]any{"payload": s} }
	bad := []struct {
		values map[string]any
		reason string
	}{
		{p(`not json`), event.ReasonNotJSON},
		{p(`[1,2,3]`), event.ReasonNotObject},
		{p(``), event.ReasonMissingPayload},
		{map[string]any{"body": `{"customer_id":"c"}`}, event.ReasonMissingPayload},
		{p(`{"stripe_customer_id":"cus_A","amount_cents":1,"billing_period":"2026-11"}`), event.ReasonMissingField},
		{p(`{"customer_id":"","stripe_customer_id":"cus_A","amount_cents":1,"billing_period":"2026-11"}`), event.ReasonEmptyField},
		{p(`{"customer_id":"c","stripe_customer_id":"cus_A","amount_cents":0,"billing_period":"2026-11"}`), event.ReasonAmountTooSmall},
		{p(`{"customer_id":"c","stripe_customer_id":"cus_A","amount_cents":-5,"billing_period":"2026-11"}`), event.ReasonAmountTooSmall},
		{p(`{"customer_id":"c","stripe_customer_id":"cus_A","amount_cents":25.5,"billing_period":"2026-11"}`), event.ReasonBadAmount},
		{p(`{"customer_id":"c","stripe_customer_id":"cus_A","amount_cents":"2500","billing_period":"2026-11"}`), event.ReasonBadFieldType},
		{p(`{"customer_id":"c","stripe_customer_id":"cus_A","amount_cents":999999999999,"billing_period":"2026-11"}`), event.ReasonAmountTooLarge},
		{p(`{"customer_id":"c","stripe_customer_id":"cus_A","amount_cents":1,"billing_period":"2026-11","currency":"euro"}`), event.ReasonBadCurrency},
		{p(`{"customer_id":"c","stripe_customer_id":"cus_A","amount_cents":1,"billing_period":"last month"}`), event.ReasonBadPeriod},
		{p(`{"customer_id":"c","stripe_customer_id":"acct_1","amount_cents":1,"billing_period":"2026-11"}`), event.ReasonBadStripeCust},
		{p(`{"customer_id":"c","stripe_customer_id":"cus_A","amount_cents":1,"amount_cents":900,"billing_period":"2026-11"}`), event.ReasonDuplicateField},
		{p(`{"customer_id":"c","stripe_customer_id":"cus_A","amount_cents":1,"billing_period":"2026-11","x":"` + strings.Repeat("y", 5000) + `"}`), event.ReasonPayloadTooLarge},
		{p(`{"customer_id":["c"],"stripe_customer_id":"cus_A","amount_cents":1,"billing_period":"2026-11"}`), event.ReasonBadFieldType},
	}
	ids := map[string]string{}
	for _, tc := range bad {
		ids[b.addRaw(t, tc.values)] = tc.reason
	}
	good := ev(7)
	b.add(t, good)
	start(t, b.config(t, ""))
	testenv.Eventually(t, 10*time.Second, func() bool { return b.status(good) == ledger.StatusCharged && b.pending(t) == 0 },
		"the good event behind the bad ones is charged and everything acked")
	dl := deadLetters(t, b)
	if len(dl) != len(bad) {
		t.Fatalf("%d dead letters, want %d", len(dl), len(bad))
	}
	for _, m := range dl {
		src, _ := m.Values["source_id"].(string)
		want, ok := ids[src]
		if !ok {
			t.Fatalf("dead letter for unknown source %q", src)
		}
		if m.Values["reason"] != want {
			t.Errorf("%s: reason %v, want %s (detail %v)", src, m.Values["reason"], want, m.Values["detail"])
		}
		if m.Values["group"] != b.group || m.Values["detail"] == "" {
			t.Errorf("%s: dead letter lacks group or detail: %v", src, m.Values)
		}
		if _, hasPayload := m.Values["payload"]; !hasPayload {
			if _, hasBody := m.Values["body"]; !hasBody {
				t.Errorf("%s: the original fields were not kept", src)
			}
		}
	}
	if b.sim.ChargeCreates() != 1 {
		t.Fatalf("%d charge creates, want 1", b.sim.ChargeCreates())
	}
}

// A conflicting event (same customer and period, another amount) is not a
// second charge: it is dead-lettered for a human.
func TestConflictingEventDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	first := ev(1)
	second := first
	second.AmountCents = 99_999
	b.add(t, first)
	start(t, b.config(t, ""))
	testenv.Eventually(t, 10*time.Second, func() bool { return b.status(first) == ledger.StatusCharged }, "first charged")
	b.add(t, second)
	testenv.Eventually(t, 10*time.Second, func() bool { return len(deadLetters(t, b)) == 1 && b.pending(t) == 0 }, "second dead-lettered")
	if dl := deadLetters(t, b); dl[0].Values["reason"] != consumer.ReasonConflict {
		t.Fatalf("reason %v", dl[0].Values["reason"])
	}
	if n := b.charges(first); n != 1 {
		t.Fatalf("%d charges", n)
	}
}

// The same event under another namespace (a role started with the wrong
// --namespace) conflicts with its own row: the dead letter's detail names
// the namespace, not two identical charges.
func TestConflictDetailNamesTheNamespace(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	e := ev(1)
	b.add(t, e)
	first := b.config(t, "")
	first.Namespace = "" // the default
	c := start(t, first)
	testenv.Eventually(t, 10*time.Second, func() bool { return b.status(e) == ledger.StatusCharged }, "charged")
	if err := c.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	cfg := b.config(t, "other")
	cfg.Namespace = "prod"
	b.add(t, e)
	start(t, cfg)
	testenv.Eventually(t, 10*time.Second, func() bool { return len(deadLetters(t, b)) == 1 && b.pending(t) == 0 }, "dead-lettered")
	dl := deadLetters(t, b)[0].Values
	detail, _ := dl["detail"].(string)
	if dl["reason"] != consumer.ReasonConflict || !strings.Contains(detail, `keyed under namespace "pelguard"`) ||
		!strings.Contains(detail, `--namespace "prod"`) {
		t.Fatalf("dead letter %v", dl)
	}
	if n := b.charges(e); n != 1 {
		t.Fatalf("%d charges", n)
	}
}

// A spend cap is never passed: the event that would pass it is not charged
// but dead-lettered with reason spend_cap, replayable once the cap is raised.
func TestSpendCapDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	ctx := context.Background()
	if _, err := b.ledger.SetCap(ctx, "2026-11", 2500); err != nil {
		t.Fatal(err)
	}
	evs := []event.Event{ev(1), ev(2), ev(3)} // 1001 + 1002 + 1003 cents
	b.add(t, evs...)
	cfg := b.config(t, "")
	cfg.Workers = 1
	c1 := start(t, cfg)
	testenv.Eventually(t, 10*time.Second, func() bool { return len(deadLetters(t, b)) == 1 && b.pending(t) == 0 }, "third dead-lettered")
	if dl := deadLetters(t, b); dl[0].Values["reason"] != consumer.ReasonSpendCap {
		t.Fatalf("reason %v", dl[0].Values["reason"])
	}
	if b.sim.ChargeCreates() != 2 || b.charges(evs[2]) != 0 {
		t.Fatalf("creates %d; the capped event must not be charged", b.sim.ChargeCreates())
	}
	if err := c1.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// --require-cap: a period without a cap is refused outright.
	cfg2 := b.config(t, "")
	cfg2.RequireCap = true
	other := event.Event{CustomerID: "c_x", StripeCustomerID: "cus_x", AmountCents: 5, BillingPeriod: "2026-12", Currency: "usd"}
	b.add(t, other)
	start(t, cfg2)
	testenv.Eventually(t, 10*time.Second, func() bool { return len(deadLetters(t, b)) == 2 && b.pending(t) == 0 }, "uncapped period refused")
	if dl := deadLetters(t, b); dl[1].Values["reason"] != consumer.ReasonNoSpendCap {
		t.Fatalf("reason %v", dl[1].Values["reason"])
	}
}

// SIGTERM during a Stripe call: reading stops, the call finishes and is
// recorded and acked, Stop returns nil.
func TestShutdownFinishesInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	_ = b.sim.SetFaults(simLatency(800 * time.Millisecond))
	e := ev(1)
	b.add(t, e)
	c, err := consumer.New(b.config(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return b.status(e) == ledger.StatusPending }, "call in flight")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if b.status(e) != ledger.StatusCharged || b.pending(t) != 0 || b.charges(e) != 1 {
		t.Fatalf("after Stop: status %s pending %d charges %d", b.status(e), b.pending(t), b.charges(e))
	}
	// A deadline shorter than the call: Stop returns the deadline error, the
	// entry stays pending (safe to redeliver), nothing is lost.
	e2 := ev(2)
	b.add(t, e2)
	c2 := start(t, b.config(t, ""))
	testenv.Eventually(t, 10*time.Second, func() bool { return b.status(e2) == ledger.StatusPending }, "second call in flight")
	short, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if err := c2.Stop(short); err == nil {
		t.Fatal("Stop should report its deadline")
	}
	if b.status(e2) == ledger.StatusCharged && b.pending(t) == 0 {
		t.Log("the call happened to finish inside the deadline")
	} else if b.pending(t) != 1 {
		t.Fatalf("a cut-short event must stay pending, pending=%d", b.pending(t))
	}
}

// Shutting down with a batch reserved but not yet handed to a worker gives
// those leases back: the entries stay pending and the next delivery takes
// them over at once instead of waiting for the leases to expire.
func TestShutdownReleasesQueuedLeases(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	_ = b.sim.SetFaults(simLatency(500 * time.Millisecond))
	var evs []event.Event
	for i := range 10 {
		evs = append(evs, ev(i))
	}
	b.add(t, evs...)
	cfg := b.config(t, "")
	cfg.Workers = 1
	cfg.Count = 10
	cfg.Lease = time.Minute
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		n, _ := b.ledger.Counts(context.Background())
		return n[ledger.StatusPending] == 10
	}, "the batch reserved")
	if err := c.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, e := range evs {
		r := b.record(t, e)
		if r.Status == ledger.StatusPending && r.LeaseLive(time.Now()) {
			held++
		}
	}
	if held != 0 {
		t.Fatalf("%d queued events still hold a lease after a clean stop", held)
	}
	if p := b.pending(t); p+int64(b.sim.ChargeCreates()) < 10 {
		t.Fatalf("events lost: %d pending, %d charged", p, b.sim.ChargeCreates())
	}
}

// An event parked for the spend cap is billed once the cap is raised and
// the dead letter replayed; replaying everything again changes nothing.
func TestReplayAfterRaisingTheCap(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	ctx := context.Background()
	if _, err := b.ledger.SetCap(ctx, "2026-11", 1500); err != nil {
		t.Fatal(err)
	}
	first, second := ev(1), ev(2) // 1001 + 1002 cents: the second passes the cap
	b.add(t, first)
	b.add(t, second)
	cfg := b.config(t, "")
	cfg.Workers = 1
	start(t, cfg)
	testenv.Eventually(t, 10*time.Second, func() bool { return len(deadLetters(t, b)) == 1 && b.pending(t) == 0 }, "second parked")
	// A dry run lists it and changes nothing.
	if got, err := consumer.ReplayDeadLetters(ctx, b.rdb, b.stream, consumer.ReasonSpendCap, 0, true); err != nil || len(got) != 1 {
		t.Fatalf("dry run: %v %v", got, err)
	}
	if len(deadLetters(t, b)) != 1 {
		t.Fatal("a dry run must not touch the dead letters")
	}
	if _, err := b.ledger.SetCap(ctx, "2026-11", 5000); err != nil {
		t.Fatal(err)
	}
	got, err := consumer.ReplayDeadLetters(ctx, b.rdb, b.stream, consumer.ReasonSpendCap, 0, false)
	if err != nil || len(got) != 1 || got[0].NewID == "" {
		t.Fatalf("replay: %v %v", got, err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return b.status(second) == ledger.StatusCharged && b.pending(t) == 0 }, "replayed event charged")
	if len(deadLetters(t, b)) != 0 {
		t.Fatal("the replayed dead letter should be gone")
	}
	// The replayed entry carries the original payload and the replay marker only.
	msgs, _ := b.rdb.XRange(ctx, b.stream, got[0].NewID, got[0].NewID).Result()
	if len(msgs) != 1 || len(msgs[0].Values) != 2 || msgs[0].Values["payload"] != second.Payload() ||
		msgs[0].Values[consumer.ReplayedFromField] != got[0].DeadID {
		t.Fatalf("replayed fields %v", msgs)
	}
	if b.charges(first) != 1 || b.charges(second) != 1 || b.sim.ChargeCreates() != 2 {
		t.Fatalf("charges: %d %d, creates %d", b.charges(first), b.charges(second), b.sim.ChargeCreates())
	}
}
