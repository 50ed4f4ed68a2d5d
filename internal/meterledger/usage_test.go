package meterledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// TestStageWindowTotals: delivered events only, summed per meter, customer
// and window: a UTC day before hourlyFrom, an hour from it on, nothing at
// or after to; DeliveredInWindow reads one window's events back, bounded.
func TestStageWindowTotals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	day := t0.Truncate(24 * time.Hour).Add(-48 * time.Hour) // 2026-11-28
	hourlyFrom := day.Add(24 * time.Hour)
	to := t0.Truncate(time.Hour) // 12:00 on the 30th
	deliver := func(cust string, v int64, ts time.Time) {
		c := b.one(t, req(mev(cust, "api_requests", v, ts), "A"))
		b.finish(t, meterledger.Outcome{Hold: c.Hold(), Result: meterledger.Delivered})
	}
	deliver("cus_1", 1, day.Add(1*time.Hour))
	deliver("cus_1", 2, day.Add(20*time.Hour))           // same day
	deliver("cus_1", 4, hourlyFrom.Add(90*time.Minute))  // the 29th, 01:00–02:00
	deliver("cus_1", 8, hourlyFrom.Add(100*time.Minute)) // same hour
	deliver("cus_2", 16, hourlyFrom.Add(3*time.Hour))    // another customer
	deliver("cus_1", 32, to.Add(10*time.Minute))         // at or after to: left out
	failed := b.one(t, req(mev("cus_1", "api_requests", 64, day.Add(2*time.Hour)), "A"))
	b.finish(t, meterledger.Outcome{Hold: failed.Hold(), Result: meterledger.Failed, Reason: "refused"})
	b.one(t, req(mev("cus_1", "api_requests", 128, day.Add(3*time.Hour)), "A")) // still sending

	n, err := b.l.StageWindowTotals(ctx, 7, day, hourlyFrom, to)
	if err != nil || n != 3 {
		t.Fatalf("staged %d windows (%v), want 3", n, err)
	}
	type win struct {
		cust       string
		start, end time.Time
		value      int64
		events     int64
	}
	rows, err := b.pool.Query(ctx, `SELECT stripe_customer_id, window_start, window_end, value::bigint, events
		FROM `+testenv.SchemaOf(b.pool)+`.usage_stage WHERE run_id = 7 ORDER BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	var got []win
	for rows.Next() {
		var w win
		if err := rows.Scan(&w.cust, &w.start, &w.end, &w.value, &w.events); err != nil {
			t.Fatal(err)
		}
		got = append(got, w)
	}
	want := []win{
		{"cus_1", day, hourlyFrom, 3, 2},
		{"cus_1", hourlyFrom.Add(time.Hour), hourlyFrom.Add(2 * time.Hour), 12, 2},
		{"cus_2", hourlyFrom.Add(3 * time.Hour), hourlyFrom.Add(4 * time.Hour), 16, 1},
	}
	if len(got) != len(want) {
		t.Fatalf("stage = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].cust != want[i].cust || !got[i].start.Equal(want[i].start) || !got[i].end.Equal(want[i].end) ||
			got[i].value != want[i].value || got[i].events != want[i].events {
			t.Fatalf("stage[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}

	evs, more, err := b.l.DeliveredInWindow(ctx, "api_requests", "cus_1", day, hourlyFrom, 1)
	if err != nil || !more || len(evs) != 1 || evs[0].Value != 1 {
		t.Fatalf("DeliveredInWindow limit 1: %+v more=%v %v", evs, more, err)
	}
	evs, more, err = b.l.DeliveredInWindow(ctx, "api_requests", "cus_1", day, hourlyFrom, 10)
	if err != nil || more || len(evs) != 2 || evs[1].Value != 2 || evs[0].FirstSentAt.IsZero() {
		t.Fatalf("DeliveredInWindow: %+v more=%v %v", evs, more, err)
	}
	if _, err := b.l.StageWindowTotals(ctx, 8, hourlyFrom, day, to); err == nil {
		t.Fatal("a daily start after the hourly start was taken")
	}
}
