package consumer_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// A backlog caught up with a minute's bucket: three customers' events
// spread over three minutes of timestamps, each entry added when its event
// happened (the stream filled while no consumer ran). Two consumers with
// --aggregate-bucket 1m send one call per customer and minute, at the
// minute's start, carrying the exact sum of the minute's events — the
// event at 59.9 s in its minute, the one at 0.0 s in the next — and the
// ledger records every event delivered in the aggregate Stripe counted.
func TestAMinuteBucketSendsOneCallPerCustomerAndMinute(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	b := meterWorld(t, now)
	if err := b.sim.SetFaults(stripesim.Faults{MeterEventLatency: 20 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if _, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: b.rdb, DB: b.pool, Stripe: b.stripe, Stream: b.stream,
		Group: b.group, SendFromLedger: true, AggregateMeters: []string{meterName}, AggregateBucket: 7 * time.Second}); err == nil {
		t.Fatal("a 7s bucket was accepted: its buckets would straddle an hour")
	}
	minute := now.Add(-10 * time.Minute).Truncate(time.Minute)
	var all []event.MeterEvent
	want := map[string]int64{} // customer@minute → sum
	for c := 1; c <= 3; c++ {
		for i, off := range []time.Duration{0, 700 * time.Millisecond, 13 * time.Second, 59*time.Second + 900*time.Millisecond,
			time.Minute, time.Minute + 30*time.Second, 2*time.Minute + 59*time.Second, 2 * time.Minute} {
			e := meterEvent(c, i, minute.Add(off+time.Duration(c)*time.Millisecond))
			all = append(all, e)
			want[fmt.Sprintf("%s@%d", e.StripeCustomerID, e.Timestamp.Truncate(time.Minute).Unix())] += e.Value
		}
	}
	// Entries in the order their events happened, each with its event's
	// time as its id.
	slices.SortStableFunc(all, func(x, y event.MeterEvent) int { return x.Timestamp.Compare(y.Timestamp) })
	for i, e := range all {
		id := fmt.Sprintf("%d-%d", e.Timestamp.UnixMilli(), i)
		if err := b.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: b.stream, ID: id,
			Values: map[string]any{"payload": e.Payload()}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for _, name := range []string{"m-a", "m-b"} {
		c, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: b.rdb, DB: b.pool, Schema: testenv.SchemaOf(b.pool),
			Stripe: b.stripe, Stream: b.stream, Group: b.group, Name: name, Namespace: "test", Block: 50 * time.Millisecond,
			Lease: 3 * time.Second, Logger: testenv.Logger(t), Clock: b.clk, SendFromLedger: true,
			AggregateMeters: []string{meterName}, AggregateBucket: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = c.Run(ctx) }()
	}
	totals := sums(all)
	testenv.Eventually(t, 60*time.Second, func() bool {
		for cus, v := range totals {
			if b.sim.MeterTotal(meterName, cus) != v {
				return false
			}
		}
		return true
	}, "not every customer was counted (%+v)", b.sim.MeterEventCounts())
	time.Sleep(300 * time.Millisecond) // nothing more may come
	cancel()
	wg.Wait()

	got := map[string]int64{}
	for _, e := range b.sim.MeterEvents(meterName, "") {
		k := fmt.Sprintf("%s@%d", e.Customer, e.Timestamp.Unix())
		if _, dup := got[k]; dup || e.Cancelled || !e.Timestamp.Equal(e.Timestamp.Truncate(time.Minute)) {
			t.Fatalf("Stripe event %+v: want one call per customer and minute, at the minute's start (seen before: %v)", e, dup)
		}
		got[k] = e.Value
	}
	if len(got) != len(want) {
		t.Fatalf("Stripe has %d calls %v, want %d (one per customer and minute) %v", len(got), got, len(want), want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: Stripe counts %d, the minute's events add up to %d", k, got[k], v)
		}
	}
	if calls := b.sim.MeterEventCounts(); calls.Concurrent != 0 {
		t.Fatalf("emulator %+v: a customer-meter had two calls at once", calls)
	}
	var events, aggs, undelivered int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT aggregate),
			count(*) FILTER (WHERE status <> 'delivered' OR aggregate IS NULL) FROM meter_events`).Scan(&events, &aggs, &undelivered); err != nil {
		t.Fatal(err)
	}
	if events != len(all) || aggs != len(want) || undelivered != 0 {
		t.Fatalf("ledger: %d events in %d aggregates, %d not delivered in one; want %d in %d, all delivered", events, aggs, undelivered,
			len(all), len(want))
	}
}
