package meterledger_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/meterledger"
)

// BenchmarkBusySecond: one second of a busy customer — busyEvents events of
// one customer-meter — formed into one aggregate and recorded delivered: the
// ledger's part of the busy customer's cycle, which decides how far its
// counted usage trails its production. Reports the milliseconds of each
// step per second of events: form (the aggregate saved, its members moved
// to sending under it) and record (its outcome recorded with its members:
// its slot free, the next second can be formed).
func BenchmarkBusySecond(b *testing.B) {
	bn := setup(b)
	ctx := context.Background()
	n := busyEvents()

	key := []meterledger.MeterKey{{EventName: "tokens", StripeCustomerID: "cus_busy"}}
	var form, record time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		sec := t0.Add(-50 * time.Minute).Add(time.Duration(i) * time.Second)
		s := sec.Unix()
		reqs := make([]meterledger.IngestRequest, 0, 500)
		for j := range n {
			ts := sec.Add(time.Duration(j) * time.Second / time.Duration(n))
			reqs = append(reqs, ingestReq(mev("cus_busy", "tokens", int64(1+j%7), ts), fmt.Sprintf("%d-%d", s*1000+int64(j*1000/n), j)))
			if len(reqs) == cap(reqs) || j == n-1 {
				if _, err := bn.l.Ingest(ctx, reqs); err != nil {
					b.Fatal(err)
				}
				reqs = reqs[:0]
			}
		}
		b.StartTimer()
		start := time.Now()
		formed, err := bn.l.FormAggregates(ctx, meterledger.FormRequest{Namespace: "test", Stream: "usage", From: sec,
			Watermark: sec.Add(10 * time.Second), Width: time.Second, Owner: "bench", Lease: time.Minute}, key)
		if err != nil {
			b.Fatal(err)
		}
		if len(formed) != 1 || formed[0].Aggregate.Members != n {
			b.Fatalf("second %d: formed %d aggregates, want 1 of %d members: %+v", i, len(formed), n, formed)
		}
		formedAt := time.Now()
		outs := []meterledger.AggregateOutcome{{Aggregate: formed[0].Aggregate, Result: meterledger.Delivered}}
		res, err := bn.l.FinishAggregates(ctx, outs)
		if err != nil || res[0] != meterledger.Delivered {
			b.Fatalf("second %d: recorded %v, %v; want delivered", i, res, err)
		}
		form, record = form+formedAt.Sub(start), record+time.Since(formedAt)
	}
	b.StopTimer()
	var sending, delivered int
	if err := bn.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'sending'), count(*) FILTER (WHERE status = 'delivered')
		FROM meter_events WHERE stripe_customer_id = 'cus_busy'`).Scan(&sending, &delivered); err != nil {
		b.Fatal(err)
	}
	if sending != 0 || delivered != b.N*n {
		b.Fatalf("%d members sending and %d delivered after the last second; want 0 and %d", sending, delivered, b.N*n)
	}
	b.ReportMetric(float64(form.Milliseconds())/float64(b.N), "form-ms/second")
	b.ReportMetric(float64(record.Milliseconds())/float64(b.N), "record-ms/second")
	b.ReportMetric(0, "ns/op")
}

// busyEvents is the busy customer's events per second:
// PELGUARD_BENCH_BUSY_EVENTS, else 5,000.
func busyEvents() int {
	if n, err := strconv.Atoi(os.Getenv("PELGUARD_BENCH_BUSY_EVENTS")); err == nil && n > 0 {
		return n
	}
	return 5000
}
