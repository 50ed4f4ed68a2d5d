package consumer_test

import (
	"context"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// How fast the ledger's sender drains per-event meters: one busy
// customer with 100 events queued beside 100 quiet customers with one
// each, all in the ledger before sending starts, Stripe answering each
// meter event in 50 ms (so one customer-meter can go no faster than 20
// events/s). Modes, in the same run:
//   - rounds: two loops of SendRound (the next event of up to Workers
//     customer-meters, then wait for every call of the round);
//   - sender: Run's sender (each customer-meter in flight on its own, the
//     next event as soon as the last is recorded, a freed slot handed to
//     the oldest at once).
//
// Reported: busy_events/s (the busy customer's 100 events over the time
// until all were counted; 20 is the bound at 50 ms), quiet_p50_s and
// quiet_max_s (when each quiet customer's event was counted, from the
// start).
// Run: go test -run '^$' -bench BenchmarkLedgerSender -benchtime 1x -count 5 ./consumer/
func BenchmarkLedgerSender(b *testing.B) {
	for _, mode := range []string{"rounds", "sender"} {
		b.Run(mode, func(b *testing.B) {
			for range b.N {
				runLedgerSenderBench(b, mode)
			}
		})
	}
}

func runLedgerSenderBench(b *testing.B, mode string) {
	b.StopTimer()
	now := time.Now().UTC()
	w := setup(b, opts{simNow: now})
	if _, err := w.sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: meterName}); err != nil {
		b.Fatal(err)
	}
	if err := w.sim.SetFaults(stripesim.Faults{MeterEventLatency: 50 * time.Millisecond}); err != nil {
		b.Fatal(err)
	}
	var evs []event.MeterEvent
	for i := range 100 {
		evs = append(evs, meterEvent(0, i, now.Add(-time.Duration(200-i)*time.Millisecond)))
	}
	for q := 1; q <= 100; q++ {
		evs = append(evs, meterEvent(q, 0, now.Add(-time.Duration(100-q)*time.Millisecond)))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := w.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, e := range evs {
			p.XAdd(ctx, &redis.XAddArgs{Stream: w.stream, Values: map[string]any{"payload": e.Payload()}})
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	c, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: w.rdb, DB: w.pool, Schema: testenv.SchemaOf(w.pool),
		Stripe: w.stripe, Stream: w.stream, Group: w.group, Name: "sender-a", Namespace: "test", Block: 50 * time.Millisecond,
		SendFromLedger: true, Logger: testenv.Discard()})
	if err != nil {
		b.Fatal(err)
	}
	// Ingest everything first: both modes start from the same ledger.
	res, err := w.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: w.group, Consumer: "sender-a",
		Streams: []string{w.stream, ">"}, Count: int64(len(evs))}).Result()
	if err != nil {
		b.Fatal(err)
	}
	if _, err := c.ProcessBatch(ctx, res[0].Messages); err != nil {
		b.Fatal(err)
	}
	totals := sums(evs)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	b.StartTimer()
	start := time.Now()
	switch mode {
	case "rounds":
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sleepCtx(ctx, time.Duration(i)*20*time.Millisecond)
				for ctx.Err() == nil {
					if n, err := c.SendRound(ctx); err != nil || n == 0 {
						sleepCtx(ctx, 50*time.Millisecond)
					}
				}
			}()
		}
	case "sender":
		wg.Add(1)
		go func() { defer wg.Done(); _ = c.Run(ctx) }()
	}
	counted := map[string]time.Duration{}
	deadline := time.Now().Add(2 * time.Minute)
	for len(counted) < len(totals) {
		if time.Now().After(deadline) {
			b.Fatalf("%s: %d of %d customers counted after 2 minutes", mode, len(counted), len(totals))
		}
		time.Sleep(10 * time.Millisecond)
		for cus, v := range totals {
			if _, ok := counted[cus]; !ok && w.sim.MeterTotal(meterName, cus) == v {
				counted[cus] = time.Since(start)
			}
		}
	}
	b.StopTimer()
	var quiet []float64
	for cus, d := range counted {
		if cus != "cus_0" {
			quiet = append(quiet, d.Seconds())
		}
	}
	sort.Float64s(quiet)
	for cus, v := range totals {
		if got := w.sim.MeterTotal(meterName, cus); got != v {
			b.Fatalf("%s: Stripe counts %d for %s, want %d", mode, got, cus, v)
		}
	}
	b.ReportMetric(100/counted["cus_0"].Seconds(), "busy_events/s")
	b.ReportMetric(quiet[len(quiet)/2], "quiet_p50_s")
	b.ReportMetric(quiet[len(quiet)-1], "quiet_max_s")
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
