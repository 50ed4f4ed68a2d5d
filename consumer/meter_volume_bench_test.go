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

// The end-to-end figure of usage at volume, at a smaller scale than one
// busy customer at 5,000 events/s for 60 s beside 10,000 quiet ones at
// 0.05 events/s: here one busy customer at 300 events/s for 10 s (3,000
// events) beside 1,000 quiet customers at 0.1 events/s (1,000 events), one
// sum meter, Stripe answering each meter event in 20 ms, two consumers,
// real Redis and Postgres. Each mode waits until every event is counted at
// the emulator, or until busyBenchCap after the last event:
//   - per_event: today's path, per event from the pending entries
//     (SendFromLedger false);
//   - from_ledger: per event from the ledger (SendFromLedger);
//   - aggregated: from the ledger with the meter aggregated per customer
//     and second (AggregateMeters).
//
// Reported: counted_events/s (events counted at the emulator over the time
// from the first event to the last counted, or to the cap), busy_lag_s_max
// and quiet_lag_s_max (how far the busy customer's, and the quiet
// customers' together, counted usage trailed their production at worst,
// sampled every 100 ms: the age of the oldest unit produced and not yet
// counted), calls/event (Stripe calls, refusals included, per event
// counted), customers_short (customers whose usage was not all counted
// at the cap: nonzero only where the mode could not catch up within it).
// Events counted are the units counted as a share of those produced, times
// the events produced (an aggregate counts several events in one).
// Run: go test -run '^$' -bench BenchmarkBusyCustomerEndToEnd -benchtime 1x -count 3 ./consumer/
func BenchmarkBusyCustomerEndToEnd(b *testing.B) {
	for _, mode := range []string{"per_event", "from_ledger", "aggregated"} {
		b.Run(mode, func(b *testing.B) {
			for range b.N {
				runBusyBench(b, mode)
			}
		})
	}
}

const (
	busyBenchSeconds = 10
	busyBenchPerTick = 30   // busy events per 100 ms: 300/s
	busyBenchQuiet   = 1000 // quiet customers, 0.1 events/s each: 10 a tick
	busyBenchLatency = 20 * time.Millisecond
	busyBenchCap     = 40 * time.Second
)

// usageCurve is cumulative units produced over time, a point per tick.
type usageCurve struct {
	at    []time.Time
	units []int64
}

func (c *usageCurve) add(at time.Time, units int64) {
	last := int64(0)
	if n := len(c.units); n > 0 {
		last = c.units[n-1]
	}
	c.at, c.units = append(c.at, at), append(c.units, last+units)
}

// lag is how long ago the oldest unit not yet counted was produced
// (0: everything produced is counted).
func (c *usageCurve) lag(counted int64, now time.Time) time.Duration {
	i := sort.Search(len(c.units), func(i int) bool { return c.units[i] > counted })
	if i == len(c.units) {
		return 0
	}
	return now.Sub(c.at[i])
}

func runBusyBench(b *testing.B, mode string) {
	b.StopTimer()
	w := setup(b, opts{simNow: time.Now().UTC()})
	if _, err := w.sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: meterName}); err != nil {
		b.Fatal(err)
	}
	if err := w.sim.SetFaults(stripesim.Faults{MeterEventLatency: busyBenchLatency}); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for _, name := range []string{"bench-a", "bench-b"} {
		cfg := consumer.MeterConfig{Redis: w.rdb, DB: w.pool, Schema: testenv.SchemaOf(w.pool), Stripe: w.stripe,
			Stream: w.stream, Group: w.group, Name: name, Namespace: "test", Block: 50 * time.Millisecond}
		switch mode {
		case "from_ledger":
			cfg.SendFromLedger = true
		case "aggregated":
			cfg.SendFromLedger, cfg.AggregateMeters = true, []string{meterName}
		}
		c, err := consumer.NewMeterConsumer(cfg)
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = c.Run(ctx) }()
	}
	defer wg.Wait()
	defer cancel()

	var (
		mu            sync.Mutex
		busy, quiet   usageCurve
		produced      int
		producing     = true
		busyLag, qLag time.Duration
	)
	b.StartTimer()
	start := time.Now()
	// The sampler: what the emulator counted against what was produced.
	sampled := make(chan struct{})
	var countedUnits int64
	var last time.Time
	go func() {
		defer close(sampled)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for range t.C {
			var bu, qu int64
			evs := w.sim.MeterEvents(meterName, "")
			for _, e := range evs {
				if e.Customer == "cus_0" {
					bu += e.Value
				} else {
					qu += e.Value
				}
			}
			now := time.Now()
			mu.Lock()
			busyLag, qLag = max(busyLag, busy.lag(bu, now)), max(qLag, quiet.lag(qu, now))
			done := !producing && busy.lag(bu, now) == 0 && quiet.lag(qu, now) == 0
			over := !producing && now.Sub(last) > busyBenchCap
			countedUnits = bu + qu
			mu.Unlock()
			if done || over || ctx.Err() != nil {
				return
			}
		}
	}()
	tick := time.NewTicker(100 * time.Millisecond)
	var all []event.MeterEvent
	for k := range busyBenchSeconds * 10 {
		<-tick.C
		at := time.Now().UTC()
		var evs []event.MeterEvent
		var bu, qu int64
		for i := range busyBenchPerTick {
			e := meterEvent(0, k*busyBenchPerTick+i, at.Add(time.Duration(i)*time.Millisecond))
			bu += e.Value
			evs = append(evs, e)
		}
		for j := range busyBenchQuiet / 100 {
			q := 1 + (k*busyBenchQuiet/100+j)%busyBenchQuiet
			e := meterEvent(q, k, at)
			qu += e.Value
			evs = append(evs, e)
		}
		if _, err := w.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, e := range evs {
				p.XAdd(ctx, &redis.XAddArgs{Stream: w.stream, Values: map[string]any{"payload": e.Payload()}})
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		mu.Lock()
		busy.add(at, bu)
		quiet.add(at, qu)
		produced += len(evs)
		mu.Unlock()
		all = append(all, evs...)
	}
	tick.Stop()
	mu.Lock()
	producing, last = false, time.Now()
	mu.Unlock()
	<-sampled
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()

	mu.Lock()
	defer mu.Unlock()
	c := w.sim.MeterEventCounts()
	calls := c.Recorded + c.Duplicates + c.Concurrent + c.RateLimited + c.Invalid
	left := 0
	totals := sums(all)
	for cus, v := range totals {
		if got := w.sim.MeterTotal(meterName, cus); got > v {
			b.Fatalf("%s: Stripe counts %d, more than the %d produced", cus, got, v)
		} else if got < v {
			left++
		}
	}
	producedUnits := busy.units[len(busy.units)-1] + quiet.units[len(quiet.units)-1]
	counted := float64(produced) * float64(countedUnits) / float64(producedUnits)
	b.ReportMetric(counted/elapsed.Seconds(), "counted_events/s")
	b.ReportMetric(busyLag.Seconds(), "busy_lag_s_max")
	b.ReportMetric(qLag.Seconds(), "quiet_lag_s_max")
	b.ReportMetric(float64(calls)/counted, "calls/event")
	b.ReportMetric(float64(left), "customers_short")
	b.Logf("%s: %d events produced in %d s; %s until counted or the cap; emulator %+v; %d customers short",
		mode, produced, busyBenchSeconds, elapsed.Round(time.Millisecond), c, left)
}
