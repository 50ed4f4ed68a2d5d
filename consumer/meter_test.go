package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

const meterName = "api_requests"

func meterEvent(cust, i int, at time.Time) event.MeterEvent {
	return event.MeterEvent{EventName: meterName, CustomerID: fmt.Sprintf("c_%d", cust),
		StripeCustomerID: fmt.Sprintf("cus_%d", cust), Value: int64(1 + i%5), Timestamp: at,
		EventID: fmt.Sprintf("req-%d-%d", cust, i)}
}

// meterWorld is setup's world with a sum meter at the emulator.
func meterWorld(t *testing.T, simNow time.Time) *bundle {
	t.Helper()
	return meterWorldWith(t, opts{simNow: simNow})
}

// meterWorldWith is meterWorld with setup's options (a clock).
func meterWorldWith(t *testing.T, o opts) *bundle {
	t.Helper()
	b := setup(t, o)
	if _, err := b.sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: meterName}); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *bundle) meterConsumer(t *testing.T, name string) *consumer.MeterConsumer {
	t.Helper()
	return b.meterConsumerWith(t, name, nil)
}

func (b *bundle) meterConsumerWith(t *testing.T, name string, m *consumer.Metrics) *consumer.MeterConsumer {
	t.Helper()
	c, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: b.rdb, DB: b.pool, Schema: testenv.SchemaOf(b.pool),
		Stripe: b.stripe, Stream: b.stream, Group: b.group, Name: name, Namespace: "test", Block: 50 * time.Millisecond,
		Lease: 3 * time.Second, Metrics: m, Logger: testenv.Logger(t), Clock: b.clk})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (b *bundle) addMeter(t *testing.T, evs ...event.MeterEvent) {
	t.Helper()
	for _, e := range evs {
		if err := b.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: b.stream, Values: map[string]any{"payload": e.Payload()}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// sums is what each customer's events add up to.
func sums(evs []event.MeterEvent) map[string]int64 {
	out := map[string]int64{}
	for _, e := range evs {
		out[e.StripeCustomerID] += e.Value
	}
	return out
}

func (b *bundle) assertMeterTotals(t *testing.T, want map[string]int64) {
	t.Helper()
	for cus, v := range want {
		if got := b.sim.MeterTotal(meterName, cus); got != v {
			t.Errorf("%s: Stripe counts %d, the events add up to %d", cus, got, v)
		}
	}
}

// Every event counted once at Stripe, two consumers sharing the stream,
// several events of one customer in the same batch (one call per customer
// and meter at a time: the emulator refuses a second one in flight).
func TestMeterEventsAreCountedOnce(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	b := meterWorld(t, now)
	if err := b.sim.SetFaults(stripesim.Faults{MeterEventLatency: 20 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	var evs []event.MeterEvent
	for i := range 120 {
		evs = append(evs, meterEvent(i%6, i, now.Add(-time.Duration(i)*time.Second)))
	}
	b.addMeter(t, evs...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	m := consumer.NewMetrics(prometheus.NewRegistry())
	for _, name := range []string{"m-a", "m-b"} {
		c := b.meterConsumerWith(t, name, m)
		wg.Add(1)
		go func() { defer wg.Done(); _ = c.Run(ctx) }()
	}
	testenv.Eventually(t, 60*time.Second, func() bool { return b.pending(t) == 0 && b.sim.MeterEventCounts().Recorded == 120 },
		"the meter events were not all delivered (%+v, %d pending)", b.sim.MeterEventCounts(), b.pending(t))
	cancel()
	wg.Wait()
	b.assertMeterTotals(t, sums(evs))
	if c := b.sim.MeterEventCounts(); c.Concurrent != 0 || c.Recorded != 120 {
		t.Fatalf("emulator counts %+v: want 120 recorded and no call while another of the customer's was in flight", c)
	}
	if n := consumer.EventsCounted(m, b.stream, consumer.OutcomeDelivered); n != 120 {
		t.Fatalf("pelguard_consumer_events_total{outcome=delivered} = %v, want 120", n)
	}
}

// A consumer stopped while it starts (its partition check or its fence
// cut short) has stopped, not failed: Run returns nil, sending nothing.
func TestMeterRunStoppedWhileStartingIsNotAFailure(t *testing.T) {
	t.Parallel()
	b := meterWorld(t, time.Now().UTC())
	b.addMeter(t, meterEvent(1, 1, time.Now().UTC()))
	for _, fromLedger := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		c := b.meterConsumer(t, fmt.Sprintf("m-stopped-%v", fromLedger))
		if fromLedger {
			c = b.aggConsumer(t, fmt.Sprintf("m-stopped-%v", fromLedger), 3*time.Second)
		}
		if err := c.Run(ctx); err != nil {
			t.Fatalf("send from ledger %v: Run with its context ended before it started = %v, want nil", fromLedger, err)
		}
	}
	if n := b.sim.MeterEventCounts().Recorded; n != 0 {
		t.Fatalf("%d meter events recorded by consumers that never started", n)
	}
}

// Two of the seed's failure modes, for meter events: a batch read again
// after a partial failure (the replies lost after Stripe recorded the
// events), and a redelivery of acked entries (an AOF rollback). Stripe
// counts each event once. (The third, a reclaim while the holder is inside
// the call, is TestMeterEventsAreCountedOnce's two consumers and the
// ledger's lease: a live lease is Busy.)
func TestMeterFailureModesCountOnce(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	b := meterWorld(t, now)
	var evs []event.MeterEvent
	for i := range 10 {
		evs = append(evs, meterEvent(i, i, now.Add(-time.Minute)))
	}
	b.addMeter(t, evs...)
	msgs := b.read(t, "m-a", 10)
	dump, err := b.rdb.Dump(context.Background(), b.stream).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Partial batch: Stripe records three events and the replies are lost.
	if err := b.sim.SetFaults(stripesim.Faults{DropNextMeterEvents: 3}); err != nil {
		t.Fatal(err)
	}
	a := b.meterConsumer(t, "m-a")
	ctx := context.Background()
	first, err := a.ProcessBatch(ctx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	if first.Delivered != 7 || first.Left != 3 {
		t.Fatalf("first batch %+v: want 7 delivered and the 3 lost replies left pending", first)
	}
	// The whole batch read again (reclaimed): the 7 are acked without a
	// call, the 3 re-sent under their identifiers and found delivered.
	again, err := a.ProcessBatch(ctx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	if again.Already != 7 || again.Delivered != 3 {
		t.Fatalf("batch read again %+v: want 7 already delivered, 3 delivered", again)
	}
	// The AOF rollback: every entry back as pending, a day later.
	if err := b.rdb.RestoreReplace(ctx, b.stream, 0, dump).Err(); err != nil {
		t.Fatal(err)
	}
	back, err := a.ProcessBatch(ctx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	if back.Already != 10 || back.Delivered != 0 {
		t.Fatalf("after the rollback %+v: want all 10 acked as already delivered", back)
	}
	b.assertMeterTotals(t, sums(evs))
	if c := b.sim.MeterEventCounts(); c.Recorded != 10 {
		t.Fatalf("emulator recorded %d events, want 10", c.Recorded)
	}
	if b.pending(t) != 0 {
		t.Fatalf("%d entries still pending", b.pending(t))
	}
}

// An event whose outcome is unknown is re-sent under its identifier only
// while Stripe still guards it; a day later it is parked, not re-sent, and
// a delivered event is never sent again at any age.
func TestMeterUnknownOutcomePastTheWindowIsParked(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	clk := newSimClock(now)
	b := setup(t, opts{clk: clk, simNow: now})
	if _, err := b.sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: meterName}); err != nil {
		t.Fatal(err)
	}
	lost, done := meterEvent(1, 1, now.Add(-time.Minute)), meterEvent(2, 2, now.Add(-time.Minute))
	b.addMeter(t, lost, done)
	msgs := b.read(t, "m-a", 2)
	if err := b.sim.SetFaults(stripesim.Faults{DropNextMeterEvents: 1}); err != nil {
		t.Fatal(err)
	}
	a := b.meterConsumer(t, "m-a")
	ctx := context.Background()
	first, err := a.ProcessBatch(ctx, msgs)
	if err != nil || first.Delivered+first.Left != 2 || first.Left != 1 {
		t.Fatalf("first batch %+v %v: want one delivered, one with its reply lost", first, err)
	}
	recorded := b.sim.MeterEventCounts().Recorded
	clk.Advance(25 * time.Hour)
	b.sim.Advance(25 * time.Hour)
	later, err := a.ProcessBatch(ctx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	if later.Parked != 1 || later.Already != 1 || later.Delivered != 0 {
		t.Fatalf("a day later %+v: want the unknown one parked and the delivered one acked, nothing sent", later)
	}
	if got := b.sim.MeterEventCounts().Recorded; got != recorded {
		t.Fatalf("%d events recorded at Stripe after a day, %d before: nothing may be sent again", got, recorded)
	}
	if b.pending(t) != 0 {
		t.Fatalf("%d entries still pending", b.pending(t))
	}
}

// "Fix and replay": an event Stripe refused (its meter did not exist yet)
// is recorded failed and dead-lettered; delivered again as it is, it is
// acked without a call; replayed once the meter exists, it is sent and
// counted once.
func TestMeterRefusedEventIsSentOnReplay(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	b := setup(t, opts{simNow: now})
	e := meterEvent(7, 7, now.Add(-time.Minute))
	b.addMeter(t, e)
	a := b.meterConsumer(t, "m-a")
	ctx := context.Background()
	first, err := a.ProcessBatch(ctx, b.read(t, "m-a", 1))
	if err != nil || first.DeadLetters != 1 {
		t.Fatalf("first delivery %+v %v: want a dead letter (no such meter)", first, err)
	}
	if _, err := b.sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: meterName}); err != nil {
		t.Fatal(err)
	}
	// The same entry again, not a replay (an AOF rollback): acked, no call.
	b.addMeter(t, e)
	again, err := a.ProcessBatch(ctx, b.read(t, "m-a", 1))
	if err != nil || again.Already != 1 || b.sim.MeterEventCounts().Recorded != 0 {
		t.Fatalf("redelivery %+v %v, %+v: want acked without a call", again, err, b.sim.MeterEventCounts())
	}
	// The operator's replay.
	if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: map[string]any{"payload": e.Payload(),
		consumer.ReplayedFromField: "1-0"}}).Err(); err != nil {
		t.Fatal(err)
	}
	replayed, err := a.ProcessBatch(ctx, b.read(t, "m-a", 1))
	if err != nil || replayed.Delivered != 1 {
		t.Fatalf("replay %+v %v: want it sent", replayed, err)
	}
	b.assertMeterTotals(t, sums([]event.MeterEvent{e}))
	// Replayed twice: delivered, never sent again.
	if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: map[string]any{"payload": e.Payload(),
		consumer.ReplayedFromField: "1-0"}}).Err(); err != nil {
		t.Fatal(err)
	}
	twice, err := a.ProcessBatch(ctx, b.read(t, "m-a", 1))
	if err != nil || twice.Already != 1 || b.sim.MeterEventCounts().Recorded != 1 {
		t.Fatalf("second replay %+v %v, %+v: want acked as delivered", twice, err, b.sim.MeterEventCounts())
	}
}

// A key Stripe refuses (401) counts nothing: the event is dead-lettered
// with stripe_key_error and one alert, not retried in a loop; replayed once
// the key is fixed, it is counted once.
func TestMeterEventWithARefusedKeyIsSentOnReplay(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	b := meterWorld(t, now)
	bad, err := stripeapi.New(stripeapi.Config{APIKey: "rk_test_revoked", BaseURL: b.sim.URL(), MaxNetworkRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	mem := alerts.NewMemory()
	c, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: b.rdb, DB: b.pool, Schema: testenv.SchemaOf(b.pool),
		Stripe: bad, Stream: b.stream, Group: b.group, Name: "m-a", Namespace: "test", Notifier: mem, Clock: b.clk})
	if err != nil {
		t.Fatal(err)
	}
	e := meterEvent(8, 8, now.Add(-time.Minute))
	b.addMeter(t, e)
	ctx := context.Background()
	got, err := c.ProcessBatch(ctx, b.read(t, "m-a", 1))
	if err != nil || got.DeadLetters != 1 || b.sim.MeterEventCounts().Recorded != 0 {
		t.Fatalf("with a revoked key: %+v %v, %+v", got, err, b.sim.MeterEventCounts())
	}
	dl, err := b.rdb.XRange(ctx, consumer.DeadLetterStream(b.stream), "-", "+").Result()
	if err != nil || len(dl) != 1 || dl[0].Values["reason"] != consumer.ReasonStripeKey {
		t.Fatalf("dead letters %v %v: want one %s", dl, err, consumer.ReasonStripeKey)
	}
	if n := len(mem.Alerts()); n != 1 {
		t.Fatalf("%d alerts, want 1", n)
	}
	// The key is fixed; the operator replays.
	if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: map[string]any{"payload": e.Payload(),
		consumer.ReplayedFromField: dl[0].ID}}).Err(); err != nil {
		t.Fatal(err)
	}
	replayed, err := b.meterConsumer(t, "m-a").ProcessBatch(ctx, b.read(t, "m-a", 1))
	if err != nil || replayed.Delivered != 1 {
		t.Fatalf("replay %+v %v", replayed, err)
	}
	b.assertMeterTotals(t, sums([]event.MeterEvent{e}))
}
