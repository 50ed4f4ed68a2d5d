package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// A count meter's busy customer, sending from the ledger: its events keep
// one call each, so once everyone else is counted the meter's unsent
// backlog is all its own, and the gauges say so (events queued, the
// busiest customer's share, the oldest's age); once it is sent they read
// 0 for the meter, not nothing.
func TestCountMeterBacklogIsPublished(t *testing.T) {
	t.Parallel()
	b := meterWorld(t, time.Now().UTC())
	const calls = "api_calls"
	if _, err := b.sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: calls, Formula: stripesim.FormulaCount}); err != nil {
		t.Fatal(err)
	}
	if err := b.sim.SetFaults(stripesim.Faults{MeterEventLatency: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	var evs []event.MeterEvent
	for i := range 60 {
		e := meterEvent(0, i, now.Add(-time.Duration(60-i)*time.Millisecond))
		e.EventName = calls
		evs = append(evs, e)
	}
	for q := 1; q <= 5; q++ {
		e := meterEvent(q, 0, now)
		e.EventName = calls
		evs = append(evs, e)
	}
	b.addMeter(t, evs...)
	m := consumer.NewMetrics(prometheus.NewRegistry())
	c, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: b.rdb, DB: b.pool, Schema: testenv.SchemaOf(b.pool),
		Stripe: b.stripe, Stream: b.stream, Group: b.group, Name: "m-a", Namespace: "test", Block: 50 * time.Millisecond,
		Lease: 3 * time.Second, Logger: testenv.Logger(t), SendFromLedger: true, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = c.Run(ctx) }()
	defer wg.Wait()
	defer cancel()

	quietCounted := func() bool {
		for q := 1; q <= 5; q++ {
			if len(b.sim.MeterEvents(calls, evs[60+q-1].StripeCustomerID)) != 1 {
				return false
			}
		}
		return true
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return b.pending(t) == 0 && b.ledgerRows(t) == len(evs) && quietCounted() },
		"not ingested, or the quiet customers not counted (%d pending, %d rows)", b.pending(t), b.ledgerRows(t))
	if err := consumer.PublishBacklog(c, ctx); err != nil {
		t.Fatal(err)
	}
	queued, busiest, oldest := consumer.MeterBacklogGauges(m, b.stream, calls)
	sent := len(b.sim.MeterEvents(calls, "cus_0"))
	t.Logf("with the quiet customers counted: %v queued, the busiest %v, the oldest %.1f s; %d of the busy customer's 60 counted",
		queued, busiest, oldest, sent)
	// One of the busy customer's may be in flight (sending, not queued).
	if queued == 0 || busiest != queued || int(queued) > 60-sent || int(queued) < 60-sent-1 || oldest <= 0 || oldest > 60 {
		t.Fatalf("gauges %v queued, %v busiest, %v s oldest: want the busy customer's %d unsent (or one fewer, in flight), all its own, recorded seconds ago",
			queued, busiest, oldest, 60-sent)
	}
	if q, _, _ := consumer.MeterBacklogGauges(m, b.stream, meterName); q != 0 {
		t.Fatalf("%v queued on %s, which has no events", q, meterName)
	}

	testenv.Eventually(t, 60*time.Second, func() bool { return len(b.sim.MeterEvents(calls, "cus_0")) == 60 },
		"the busy customer's events were not all counted (%d)", len(b.sim.MeterEvents(calls, "cus_0")))
	if err := consumer.PublishBacklog(c, ctx); err != nil {
		t.Fatal(err)
	}
	if q, bu, o := consumer.MeterBacklogGauges(m, b.stream, calls); q != 0 || bu != 0 || o != 0 {
		t.Fatalf("once everything is sent: %v queued, %v busiest, %v s oldest; want 0", q, bu, o)
	}
	if got := b.sim.MeterEventCounts(); got.Recorded != int64(len(evs)) || got.Concurrent != 0 {
		t.Fatalf("emulator %+v: want %d recorded, none concurrent", got, len(evs))
	}
}
