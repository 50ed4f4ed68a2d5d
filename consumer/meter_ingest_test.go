package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

func (b *bundle) ledgerRows(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+testenv.SchemaOf(b.pool)+`.meter_events`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (b *bundle) ledgerMeterConsumer(t *testing.T, name string) *consumer.MeterConsumer {
	t.Helper()
	c, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: b.rdb, DB: b.pool, Schema: testenv.SchemaOf(b.pool),
		Stripe: b.stripe, Stream: b.stream, Group: b.group, Name: name, Namespace: "test", Block: 50 * time.Millisecond,
		Lease: 3 * time.Second, Logger: testenv.Logger(t), Clock: b.clk, SendFromLedger: true})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Sending from the ledger: a busy customer's backlog never holds a quiet
// one's events. 300 events of one customer and one event each of 20 quiet
// ones, Stripe answering in 100 ms, two consumers: the stream's pending
// entries drain at ingest speed (every entry acked once its row is
// written), every quiet customer is counted within a few rounds although
// the busy customer's backlog (one call per round) is far from sent, and
// every event is counted once at the emulator in the end.
func TestBusyCustomerNeverDelaysQuietOnesFromTheLedger(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	b := meterWorld(t, now)
	if err := b.sim.SetFaults(stripesim.Faults{MeterEventLatency: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	var busy, quiet []event.MeterEvent
	for i := range 300 {
		busy = append(busy, meterEvent(0, i, now.Add(-time.Duration(300-i)*time.Millisecond)))
	}
	for c := 1; c <= 20; c++ {
		quiet = append(quiet, meterEvent(c, 0, now.Add(-time.Duration(c)*time.Millisecond)))
	}
	b.addMeter(t, busy...) // the busy customer's entries first: ahead of every quiet one
	b.addMeter(t, quiet...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for _, name := range []string{"m-a", "m-b"} {
		c := b.ledgerMeterConsumer(t, name)
		wg.Add(1)
		go func() { defer wg.Done(); _ = c.Run(ctx) }()
	}
	start := time.Now()
	testenv.Eventually(t, 30*time.Second, func() bool { return b.pending(t) == 0 && b.ledgerRows(t) == 320 },
		"the stream's entries were not all ingested (%d pending)", b.pending(t))
	ingested := time.Since(start)
	quietSums := sums(quiet)
	testenv.Eventually(t, 20*time.Second, func() bool {
		for cus, v := range quietSums {
			if b.sim.MeterTotal(meterName, cus) != v {
				return false
			}
		}
		return true
	}, "the quiet customers were not all counted while the busy one had a backlog")
	quietDone := time.Since(start)
	busyCounted := b.sim.MeterTotal(meterName, "cus_0")
	if busyCounted >= sums(busy)["cus_0"] {
		t.Fatalf("the busy customer was all counted (%d) before the quiet ones: the test shows nothing", busyCounted)
	}
	t.Logf("300 busy + 20 quiet events ingested in %s; every quiet customer counted after %s, the busy one then at %d of %d units",
		ingested.Round(time.Millisecond), quietDone.Round(time.Millisecond), busyCounted, sums(busy)["cus_0"])
	all := append(append([]event.MeterEvent{}, busy...), quiet...)
	testenv.Eventually(t, 150*time.Second, func() bool { return b.sim.MeterEventCounts().Recorded == int64(len(all)) },
		"the busy customer's events were not all sent (%+v)", b.sim.MeterEventCounts())
	cancel()
	wg.Wait()
	b.assertMeterTotals(t, sums(all))
	if c := b.sim.MeterEventCounts(); c.Concurrent != 0 || c.Recorded != int64(len(all)) {
		t.Fatalf("emulator counts %+v: want %d recorded, none while another of the customer's was in flight", c, len(all))
	}
}
