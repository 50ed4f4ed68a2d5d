package meterledger_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/meterledger"
)

// BenchmarkIngestAtVolume: the ledger work per stream page (100 entries)
// of a busy customer (half the events, one meter) beside 10,000 quiet
// ones, a spend cap on every customer ('*', never reached), 4 pages at
// once. "ingest" records them queued (Ingest: what --send-from-ledger does
// before the ack); "per-event" reserves and finishes them as a per-event
// consumer does, where only one event of a customer-meter may be in
// flight, so most of the busy customer's events are left pending
// (sendable/s counts what it could act on). Run beside
// BenchmarkReserveFinish (make bench) and compare in the same run.
func BenchmarkIngestAtVolume(b *testing.B) {
	for _, mode := range []string{"ingest", "per-event"} {
		b.Run(mode, func(b *testing.B) {
			ctx := context.Background()
			l, _, _, clk := benchLedger(b, 0)
			if _, err := l.SetCap(ctx, meterledger.Cap{EventName: "api_requests", StripeCustomerID: meterledger.AnyCustomer,
				Month: meterledger.AnyMonth, Cap: 1 << 50}); err != nil {
				b.Fatal(err)
			}
			var seq atomic.Int64
			page := func() []meterledger.Request {
				reqs := make([]meterledger.Request, 100)
				for i := range reqs {
					n := seq.Add(1)
					cus := "cus_busy"
					if n%2 == 1 {
						cus = fmt.Sprintf("cus_%d", n%10000)
					}
					ev := mev(cus, "api_requests", n%5+1, clk.Now().Add(-time.Duration(n%3600)*time.Millisecond*100))
					ev.EventID = fmt.Sprintf("req-%d", n)
					reqs[i] = req(ev, "bench")
				}
				return reqs
			}
			var done atomic.Int64
			work := func() {
				reqs := page()
				if mode == "ingest" {
					in := make([]meterledger.IngestRequest, len(reqs))
					for i, r := range reqs {
						in[i] = meterledger.IngestRequest{Request: r, Stream: "usage", Fields: map[string]any{"payload": r.Event.Payload()}}
					}
					out, err := l.Ingest(ctx, in)
					if err != nil {
						b.Error(err)
						return
					}
					for _, g := range out {
						if g.Decision == meterledger.Queued {
							done.Add(1)
						}
					}
					return
				}
				cs, err := l.Reserve(ctx, reqs)
				if err != nil {
					b.Error(err)
					return
				}
				var outs []meterledger.Outcome
				for _, c := range cs {
					if c.Decision.MaySend() {
						outs = append(outs, meterledger.Outcome{Hold: c.Hold(), Result: meterledger.Delivered})
					}
				}
				if _, err := l.Finish(ctx, outs); err != nil {
					b.Error(err)
				}
				done.Add(int64(len(outs)))
			}
			work()
			done.Store(0)
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			next := atomic.Int64{}
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= int64(b.N) {
						work()
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(done.Load())/elapsed.Seconds(), "sendable/s")
			b.ReportMetric(float64(b.N*100)/elapsed.Seconds(), "read/s")
		})
	}
}
