package consumer_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/internal/watermark"
	"github.com/pelguard/pelguard/stripeapi"
)

func (b *bundle) aggConsumer(t *testing.T, name string, lease time.Duration) *consumer.MeterConsumer {
	t.Helper()
	c, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: b.rdb, DB: b.pool, Schema: testenv.SchemaOf(b.pool),
		Stripe: b.stripe, Stream: b.stream, Group: b.group, Name: name, Namespace: "test", Block: 50 * time.Millisecond,
		Lease: lease, Logger: testenv.Logger(t), Clock: b.clk, SendFromLedger: true, AggregateMeters: []string{meterName}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (b *bundle) meterLedger(t *testing.T) *meterledger.Ledger {
	t.Helper()
	l, err := meterledger.New(b.pool, meterledger.Config{Schema: testenv.SchemaOf(b.pool), Clock: b.clk})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// A busy customer at 200 events/s for 10 s of timestamps beside 20 quiet
// ones, Stripe answering in 100 ms, two consumers aggregating the sum
// meter per second: every event counted once, in no more calls than the
// distinct (customer, second) tuples plus late joins, drained in seconds.
func TestAggregatesDrainABusyCustomerExactly(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	b := meterWorld(t, now)
	if err := b.sim.SetFaults(stripesim.Faults{MeterEventLatency: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	var all []event.MeterEvent
	tuples := map[[2]int64]bool{}
	base := now.Add(-20 * time.Second).Truncate(time.Second)
	for i := range 2000 {
		e := meterEvent(0, i, base.Add(time.Duration(i)*5*time.Millisecond))
		all = append(all, e)
		tuples[[2]int64{0, e.Timestamp.Unix()}] = true
	}
	for c := 1; c <= 20; c++ {
		e := meterEvent(c, 0, base.Add(time.Duration(c)*300*time.Millisecond))
		all = append(all, e)
		tuples[[2]int64{int64(c), e.Timestamp.Unix()}] = true
	}
	b.addMeter(t, all...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	start := time.Now()
	for _, name := range []string{"m-a", "m-b"} {
		c := b.aggConsumer(t, name, 3*time.Second)
		wg.Add(1)
		go func() { defer wg.Done(); _ = c.Run(ctx) }()
	}
	want := sums(all)
	testenv.Eventually(t, 60*time.Second, func() bool {
		for cus, v := range want {
			if b.sim.MeterTotal(meterName, cus) != v {
				return false
			}
		}
		return true
	}, "not every customer was counted (%+v)", b.sim.MeterEventCounts())
	took := time.Since(start)
	time.Sleep(300 * time.Millisecond) // nothing more may come
	cancel()
	wg.Wait()
	b.assertMeterTotals(t, want)
	calls := b.sim.MeterEventCounts()
	t.Logf("%d events, %d (customer, second) tuples: %d Stripe calls, all counted after %s", len(all), len(tuples), calls.Recorded, took.Round(time.Millisecond))
	if calls.Concurrent != 0 || calls.Recorded > int64(2*len(tuples)) {
		t.Fatalf("emulator %+v: want at most %d calls (tuples plus late joins), none concurrent per customer-meter", calls, 2*len(tuples))
	}
	l := b.meterLedger(t)
	got, err := l.DeliveredTotals(context.Background(), meterName, base.Add(-time.Hour), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range got {
		if g.Value != want[g.StripeCustomerID] || g.Value != b.sim.MeterTotal(meterName, g.StripeCustomerID) {
			t.Fatalf("%s: ledger delivered %d, Stripe %d, events %d", g.StripeCustomerID, g.Value, b.sim.MeterTotal(meterName, g.StripeCustomerID), want[g.StripeCustomerID])
		}
	}
	if len(got) != 21 {
		t.Fatalf("ledger has delivered totals of %d customers, want 21", len(got))
	}
}

// An aggregate whose call reached Stripe but whose consumer died before
// recording it: a live consumer takes it over once its lease lapses and
// re-sends it under the same identifier and value: counted once. A late
// event of the same second joins a second aggregate: counted once too.
func TestAggregateOfADeadConsumerIsCountedOnce(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	b := meterWorld(t, now)
	sec := now.Add(-time.Minute).Truncate(time.Second)
	evs := []event.MeterEvent{meterEvent(1, 0, sec), meterEvent(1, 1, sec.Add(200*time.Millisecond)), meterEvent(1, 2, sec.Add(900*time.Millisecond))}
	b.addMeter(t, evs...)
	dead := b.aggConsumer(t, "dead", 500*time.Millisecond)
	ctx := context.Background()
	if _, err := dead.ProcessBatch(ctx, b.read(t, "dead", 10)); err != nil {
		t.Fatal(err)
	}
	// The dead consumer formed the aggregate and its call got through; it
	// died before recording the outcome.
	l := b.meterLedger(t)
	a, members := b.formWhenReady(t, l, "cus_1", "dead", 500*time.Millisecond)
	if len(members) != 3 || a.Second != sec {
		t.Fatalf("formed %s of %d members, want the 3 of %s", a.Second, len(members), sec)
	}
	if _, err := b.stripe.SendMeterEvent(ctx, stripeapi.MeterEvent{EventName: meterName, StripeCustomerID: "cus_1", Value: a.Value,
		Identifier: a.Identifier, Timestamp: a.Second}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond) // its lease lapses
	live := b.aggConsumer(t, "live", 3*time.Second)
	if n, err := live.SendRound(ctx); err != nil || n != 1 {
		t.Fatalf("the live consumer's round: %d calls (%v), want the aggregate's re-send", n, err)
	}
	if got, want := b.sim.MeterTotal(meterName, "cus_1"), sums(evs)["cus_1"]; got != want {
		t.Fatalf("Stripe counts %d, the events add up to %d", got, want)
	}
	for _, m := range mustMembers(t, l, a.Identifier) {
		if m.Status != meterledger.StatusDelivered {
			t.Fatalf("member %s is %s, want delivered", m.Identifier, m.Status)
		}
	}
	// A late event of the same second: a second aggregate.
	late := meterEvent(1, 3, sec.Add(500*time.Millisecond))
	b.addMeter(t, late)
	if _, err := live.ProcessBatch(ctx, b.read(t, "live", 10)); err != nil {
		t.Fatal(err)
	}
	// It arrived after the first aggregate was formed: another arrival
	// bucket, formed once the ingest watermark has passed it.
	calls := 0
	testenv.Eventually(t, 30*time.Second, func() bool {
		n, err := live.SendRound(ctx)
		if err != nil {
			t.Fatal(err)
		}
		calls += n
		return calls > 0
	}, "the late event's aggregate was never formed")
	if calls != 1 {
		t.Fatalf("the late event's rounds: %d calls, want 1", calls)
	}
	if got, want := b.sim.MeterTotal(meterName, "cus_1"), sums(append(evs, late))["cus_1"]; got != want {
		t.Fatalf("after the late event Stripe counts %d, the events add up to %d", got, want)
	}
	if c := b.sim.MeterEventCounts(); c.Recorded != 2 {
		t.Fatalf("emulator recorded %d meter events, want 2 (the aggregate once, the late one's aggregate)", c.Recorded)
	}
}

// Past the safe window of its first attempt, a dead consumer's aggregate
// is parked with its members and never re-sent.
func TestAggregatePastTheSafeWindowIsParkedWithItsMembers(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	clk := clock.NewSim(now)
	b := setup(t, opts{simNow: now, clk: clk})
	if _, err := b.sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: meterName}); err != nil {
		t.Fatal(err)
	}
	sec := now.Add(-time.Minute).Truncate(time.Second)
	evs := []event.MeterEvent{meterEvent(2, 0, sec), meterEvent(2, 1, sec.Add(100*time.Millisecond))}
	b.addMeter(t, evs...)
	ctx := context.Background()
	c := b.aggConsumer(t, "c", 3*time.Second)
	if _, err := c.ProcessBatch(ctx, b.read(t, "c", 10)); err != nil {
		t.Fatal(err)
	}
	l := b.meterLedger(t)
	a, _ := b.formWhenReady(t, l, "cus_2", "dead", 3*time.Second)
	clk.Advance(meterledger.DefaultSafeWindow + time.Minute)
	if n, err := c.SendRound(ctx); err != nil || n != 0 {
		t.Fatalf("round past the window: %d calls (%v), want none", n, err)
	}
	if got := b.sim.MeterEventCounts().Recorded; got != 0 {
		t.Fatalf("Stripe recorded %d meter events, want none: past the window it is never re-sent", got)
	}
	for _, m := range mustMembers(t, l, a.Identifier) {
		if m.Status != meterledger.StatusParked || !m.MaybeCounted() {
			t.Fatalf("member %s is %s (maybe counted %v), want parked", m.Identifier, m.Status, m.MaybeCounted())
		}
	}
	if n := b.deadLetters(t); n != 2 {
		t.Fatalf("%d dead letters, want the 2 members (parked)", n)
	}
}

// formWhenReady forms customer's aggregate as the consumer named owner
// would, once the group's ingest watermark has passed its arrival bucket.
func (b *bundle) formWhenReady(t *testing.T, l *meterledger.Ledger, customer, owner string, lease time.Duration) (meterledger.Aggregate, []meterledger.Record) {
	t.Helper()
	var a meterledger.Aggregate
	var members []meterledger.Record
	testenv.Eventually(t, 30*time.Second, func() bool {
		mark, err := watermark.Read(context.Background(), b.rdb, b.stream, b.group)
		if err != nil {
			t.Fatal(err)
		}
		var ok bool
		a, members, ok, err = l.FormAggregate(context.Background(), "test", b.stream, meterName, customer, mark.Time(), time.Second, owner, lease)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}, "%s's aggregate was never ready", customer)
	return a, members
}

// The operator's pause is checked before each aggregate's call, not only
// at the start of a round: paused once the round has formed its aggregate,
// the round makes no call, the aggregate is undone (its members queued
// again, its slot free), and on resume the same members form it again
// under the same identifier: counted once.
func TestAggregatePausedBeforeItsCallIsNotSent(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	b := meterWorld(t, now)
	sec := now.Add(-time.Minute).Truncate(time.Second)
	evs := []event.MeterEvent{meterEvent(3, 0, sec), meterEvent(3, 1, sec.Add(300*time.Millisecond))}
	b.addMeter(t, evs...)
	ctx := context.Background()
	schema := testenv.SchemaOf(b.pool)
	// Paused as soon as an aggregate exists: between its formation and
	// its call, as an operator's pause can fall.
	var resumed, sawFormed atomic.Bool
	paused := func() bool {
		if resumed.Load() {
			return false
		}
		var formed bool
		if err := b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+schema+`.meter_aggregates)`).Scan(&formed); err != nil {
			t.Error(err)
		}
		if formed {
			sawFormed.Store(true)
		}
		return formed
	}
	c, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: b.rdb, DB: b.pool, Schema: schema, Stripe: b.stripe,
		Stream: b.stream, Group: b.group, Name: "c", Namespace: "test", Block: 50 * time.Millisecond, Lease: 3 * time.Second,
		Logger: testenv.Logger(t), Clock: b.clk, SendFromLedger: true, AggregateMeters: []string{meterName}, Paused: paused})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ProcessBatch(ctx, b.read(t, "c", 10)); err != nil {
		t.Fatal(err)
	}
	// Rounds until the ingest watermark has passed the events' arrival
	// second and one forms the aggregate.
	testenv.Eventually(t, 30*time.Second, func() bool {
		n, err := c.SendRound(ctx)
		if err != nil || n != 0 {
			t.Fatalf("a round paused before its call: %d calls (%v), want none", n, err)
		}
		return sawFormed.Load()
	}, "the aggregate was never formed")
	var formed string
	if err := b.pool.QueryRow(ctx, `SELECT coalesce(max(aggregate), '') FROM `+schema+`.meter_events`).Scan(&formed); err != nil {
		t.Fatal(err)
	}
	var queued, aggs, slots int
	if err := b.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+schema+`.meter_events WHERE status = 'queued' AND aggregate IS NULL),
		(SELECT count(*) FROM `+schema+`.meter_aggregates), (SELECT count(*) FROM `+schema+`.meter_inflight)`).Scan(&queued, &aggs, &slots); err != nil {
		t.Fatal(err)
	}
	if queued != 2 || aggs != 0 || slots != 0 || formed != "" || b.sim.MeterEventCounts().Recorded != 0 {
		t.Fatalf("paused before the call: %d members queued, %d aggregates, %d slots held, %d Stripe calls; want 2, 0, 0, 0",
			queued, aggs, slots, b.sim.MeterEventCounts().Recorded)
	}
	resumed.Store(true)
	if n, err := c.SendRound(ctx); err != nil || n != 1 {
		t.Fatalf("the round after resume: %d calls (%v), want 1", n, err)
	}
	ids := []string{evs[0].Identifier("test"), evs[1].Identifier("test")}
	want := meterledger.AggregateIdentifier("test", meterName, "cus_3", sec, ids)
	got := b.sim.MeterEvents(meterName, "cus_3")
	if len(got) != 1 || got[0].Identifier != want || b.sim.MeterTotal(meterName, "cus_3") != sums(evs)["cus_3"] {
		t.Fatalf("Stripe has %+v, want one event %s of value %d", got, want, sums(evs)["cus_3"])
	}
}

func mustMembers(t *testing.T, l *meterledger.Ledger, id string) []meterledger.Record {
	t.Helper()
	ms, err := l.Members(context.Background(), id)
	if err != nil || len(ms) == 0 {
		t.Fatalf("members of %s: %d (%v)", id, len(ms), err)
	}
	return ms
}

func (b *bundle) deadLetters(t *testing.T) int64 {
	t.Helper()
	n, err := b.rdb.XLen(context.Background(), consumer.DeadLetterStream(b.stream)).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}
