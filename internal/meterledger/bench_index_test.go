package meterledger_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/internal/meterledger"
)

// BenchmarkReserveFinishBrowserIndexes is BenchmarkReserveFinish's batch
// (100 events reserved and finished delivered, on a table that already
// holds benchRows events) on two schemas in the same run: one as migrated,
// with the meter-event browser's index (migration 00030), and one
// with it dropped, the schema before. Each op runs one batch on each, in
// alternating order; it reports both rates and the median of the per-op
// time ratios (with/without: above 1 is the index's cost).
func BenchmarkReserveFinishBrowserIndexes(b *testing.B) {
	ctx := context.Background()
	rows := benchRows()
	with, _, _, clkW := benchLedger(b, rows)
	without, poolWO, _, clkWO := benchLedger(b, rows)
	if _, err := poolWO.Exec(ctx, `DROP INDEX meter_events_customer_idx`); err != nil {
		b.Fatal(err)
	}
	seq := 0
	batch := func(l *meterledger.Ledger, clk *clock.Sim) time.Duration {
		start := time.Now()
		reqs := make([]meterledger.Request, 100)
		for i := range reqs {
			seq++
			ev := mev(fmt.Sprintf("cus_%d", seq%2000), "api_requests", int64(seq%5+1), clk.Now().Add(-time.Duration(seq%3600)*time.Second))
			ev.EventID = fmt.Sprintf("req-%d", seq)
			reqs[i] = req(ev, "bench")
		}
		cs, err := l.Reserve(ctx, reqs)
		if err != nil {
			b.Fatal(err)
		}
		outs := make([]meterledger.Outcome, 0, len(cs))
		for _, c := range cs {
			if c.Decision.MaySend() {
				outs = append(outs, meterledger.Outcome{Hold: c.Hold(), Result: meterledger.Delivered})
			}
		}
		if _, err := l.Finish(ctx, outs); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	batch(with, clkW) // prepares the statements
	batch(without, clkWO)
	var ratios []float64
	var tw, two time.Duration
	b.ResetTimer()
	for i := range b.N {
		var dw, dwo time.Duration
		if i%2 == 0 {
			dw, dwo = batch(with, clkW), batch(without, clkWO)
		} else {
			dwo, dw = batch(without, clkWO), batch(with, clkW)
		}
		tw, two = tw+dw, two+dwo
		ratios = append(ratios, float64(dw)/float64(dwo))
	}
	b.StopTimer()
	slices.Sort(ratios)
	b.ReportMetric(float64(b.N*100)/tw.Seconds(), "events/s-with")
	b.ReportMetric(float64(b.N*100)/two.Seconds(), "events/s-without")
	b.ReportMetric(ratios[len(ratios)/2], "median-ratio")
}
