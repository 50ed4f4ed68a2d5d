package audit

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

const (
	benchRows = 100_000
	benchDups = benchRows / 100 // 1 %
)

// spreadAt is the i-th of n instants spread evenly over [from, from+span).
// span × i overflows a time.Duration past about 110,000 rows over a day, so
// the product is taken in microseconds, which holds for n in the billions.
func spreadAt(from time.Time, span time.Duration, i, n int) time.Time {
	return from.Add(time.Duration(span.Microseconds()*int64(i)/int64(n)) * time.Microsecond)
}

// seedBench stores n charged ledger rows, their charges and n/100 second
// charges, spread over the 24 h window [w0, w1). The ledger is written
// 50,000 rows per COPY, so n may be 1,000,000 (BenchmarkAuditProcess seeds
// that many into a separate emulator process the same way).
func seedBench(b *testing.B, bn *bundle, n int) {
	b.Helper()
	span := w1.Sub(w0) - time.Hour
	const chunk = 50_000
	recs := make([]ledger.Record, 0, min(n, chunk))
	for i := range n {
		cust := fmt.Sprintf("c%07d", i)
		at := spreadAt(w0, span, i, n)
		id := bn.charge(cust, 2500, at, 0)
		recs = append(recs, row(cust, 2500, id, at.Add(time.Second)))
		if i%100 == 0 {
			bn.charge(cust, 2500, at.Add(30*time.Minute), 0)
		}
		if len(recs) == chunk || i == n-1 {
			bn.seed(b, recs...)
			recs = recs[:0]
		}
	}
}

// peakHeap samples HeapInuse and the live heap (as of the latest GC mark)
// until stop is called and returns both peaks.
func peakHeap() (stop func() (inuse, live uint64)) {
	var peak, peakLive atomic.Uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var ms runtime.MemStats
		sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			runtime.ReadMemStats(&ms)
			peak.Store(max(peak.Load(), ms.HeapInuse))
			metrics.Read(sample)
			peakLive.Store(max(peakLive.Load(), sample[0].Value.Uint64()))
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() (uint64, uint64) { close(done); wg.Wait(); return peak.Load(), peakLive.Load() }
}

func liveHeap() uint64 {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(sample)
	return sample[0].Value.Uint64()
}

func benchAudit(b *testing.B, parallel int, faults stripesim.Faults, rate float64) {
	bn := setup(b)
	bn.cfg.Logger = testenv.Discard()
	bn.cfg.Notifier = nil
	seedBench(b, bn, benchRows)
	if err := bn.sim.SetFaults(faults); err != nil {
		b.Fatal(err)
	}
	a := bn.auditor(b, func(c *Config) { c.Parallel = parallel; c.Stripe.RateLimit = rate })
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		base, baseLive := ms.HeapInuse, liveHeap()
		stop := peakHeap()
		b.StartTimer()
		start := time.Now()
		rep, err := a.Run(ctx, Window{From: w0, To: w1})
		wall := time.Since(start)
		b.StopTimer()
		peak, peakLive := stop()
		if err != nil {
			b.Fatal(err)
		}
		if got := len(byKind(rep.Findings)[KindDuplicate]); got != benchDups || len(rep.Findings) != benchDups {
			b.Fatalf("%d duplicates, %d findings; want %d", got, len(rep.Findings), benchDups)
		}
		b.ReportMetric(float64(rep.ChargesScanned), "charges")
		b.ReportMetric(float64(rep.Pages), "pages")
		b.ReportMetric(wall.Seconds(), "wall-s")
		// The emulator lives in the same process and holds every charge;
		// the auditor's own share is the peak above the heap before the run.
		b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MB")
		b.ReportMetric(float64(baseLive)/(1<<20), "base-live-MB")
		b.ReportMetric(float64(peak-min(peak, base))/(1<<20), "audit-heap-MB")
		// What the auditor itself keeps alive at its peak: in its own
		// process, HeapInuse stays within about twice this (GOGC=100).
		b.ReportMetric(float64(peakLive-min(peakLive, baseLive))/(1<<20), "audit-live-MB")
		if rate > 0 {
			bound := float64(rep.Pages) / rate
			b.ReportMetric(bound, "bound-s")
			b.ReportMetric(wall.Seconds()/bound, "x-bound")
		}
		b.StartTimer()
	}
}

// BenchmarkAudit100k: 100,000 ledger rows, 101,000 charges (1 % duplicates),
// emulator latency 0. Goal ≤ 10 s and ≤ 200 MB.
func BenchmarkAudit100k(b *testing.B) {
	benchAudit(b, DefaultParallel, stripesim.Faults{}, 0)
}

// BenchmarkAudit100kRateLimited: 100 ms per list page and a 25 req/s
// client-side limit, --parallel 8. Goal ≤ 1.15 × pages ÷ rate.
func BenchmarkAudit100kRateLimited(b *testing.B) {
	benchAudit(b, 8, stripesim.Faults{PageLatency: map[string]time.Duration{"/v1/charges": 100 * time.Millisecond}}, 25)
}

// The benchmark seeds can grow to a month-end window of 1,000,000 charges
// without the spread overflowing (it did past ~110,000).
func TestSpreadAtMillionRows(t *testing.T) {
	t.Parallel()
	span := 23 * time.Hour
	const n = 1_000_000
	prev := w0.Add(-time.Nanosecond)
	for _, i := range []int{0, 1, 110_000, 500_000, n - 1} {
		at := spreadAt(w0, span, i, n)
		if !at.After(prev) || !at.Before(w0.Add(span)) {
			t.Fatalf("row %d at %s: outside [%s, %s) or not after %s", i, at, w0, w0.Add(span), prev)
		}
		prev = at
	}
}
