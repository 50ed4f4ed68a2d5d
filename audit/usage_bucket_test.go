package audit

import (
	"context"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/stripeapi"
)

// Aggregates of a minute's bucket are reconciled by their members'
// timestamps, as every event is: exact, because every allowed width
// divides an hour and buckets are aligned to it, so a member and its
// bucket's start always share an hour (and a day), the reconciliation's
// finest window.

// aggregateAll forms (with width), sends and records delivered every
// aggregate of cust whose bucket is ready at mark, in the order formed.
func (w *usageWorld) aggregateAll(cust string, mark time.Time, width time.Duration) []meterledger.Aggregate {
	w.t.Helper()
	ctx := context.Background()
	var out []meterledger.Aggregate
	for {
		a, _, ok, err := w.meters.FormAggregate(ctx, testNS, ledgerStream, w.meter, cust, mark, width, "test", time.Minute)
		if err != nil {
			w.t.Fatal(err)
		}
		if !ok {
			return out
		}
		if _, err := w.sc.SendMeterEvent(ctx, stripeapi.MeterEvent{EventName: w.meter, StripeCustomerID: cust, Value: a.Value,
			Identifier: a.Identifier, Timestamp: a.Second}); err != nil {
			w.t.Fatal(err)
		}
		if got, err := w.meters.FinishAggregate(ctx, a, meterledger.Delivered, ""); err != nil || got != meterledger.Delivered {
			w.t.Fatalf("finishing the aggregate: %v %v", got, err)
		}
		out = append(out, a)
	}
}

// TestUsageOfAMinuteBucketReconcilesExactly: cus_B's events at 59:10 and
// 59:50 of an hour go as one call at 59:00, its event at 00:05 of the next
// hour as another; cus_L's minute at 59:00 is answered 200 and dropped by
// Stripe. The reconciliation finds cus_B's two hours equal (no finding, no
// correction), and re-sends cus_L's dropped minute under the aggregate's
// identifier at its minute's start — in the hour its members are
// reconciled in — so Stripe ends at exactly what was delivered.
func TestUsageOfAMinuteBucketReconcilesExactly(t *testing.T) {
	t.Parallel()
	w := setupUsage(t, stripesim.FormulaSum, stripesim.Faults{})
	hour := now.Add(-3 * time.Hour)
	w.ingest("cus_B", hour.Add(59*time.Minute+10*time.Second), 3)
	w.ingest("cus_B", hour.Add(59*time.Minute+50*time.Second+900*time.Millisecond), 4)
	w.ingest("cus_B", hour.Add(time.Hour+5*time.Second), 5)
	mark := hour.Add(2 * time.Hour)
	bs := w.aggregateAll("cus_B", mark, time.Minute)
	if len(bs) != 2 || bs[0].Value != 7 || bs[0].Members != 2 || !bs[0].Second.Equal(hour.Add(59*time.Minute)) ||
		bs[1].Value != 5 || !bs[1].Second.Equal(hour.Add(time.Hour)) {
		t.Fatalf("cus_B's aggregates %+v: want 7 (2 events) at %s and 5 at %s", bs, hour.Add(59*time.Minute), hour.Add(time.Hour))
	}
	w.ingest("cus_L", hour.Add(59*time.Minute+30*time.Second), 6)
	w.ingest("cus_L", hour.Add(59*time.Minute+59*time.Second), 2)
	if err := w.sim.SetFaults(stripesim.Faults{RejectNextMeterEvents: 1}); err != nil {
		t.Fatal(err)
	}
	ls := w.aggregateAll("cus_L", mark, time.Minute)
	if len(ls) != 1 || ls[0].Value != 8 || len(w.sim.MeterErrorReports()) != 1 {
		t.Fatalf("cus_L's aggregates %+v (%d dropped): want one of 8, dropped after its 200", ls, len(w.sim.MeterErrorReports()))
	}
	a := w.auditor(nil)
	var compared int64
	var corrections []UsageCorrection
	for range 4 {
		w.tick(15 * time.Minute)
		rep := w.run(a)
		compared += rep.WindowsCompared
		corrections = append(corrections, rep.Corrections...)
	}
	if compared < 3 {
		t.Fatalf("%d windows compared, want cus_B's two hours and cus_L's", compared)
	}
	if len(corrections) != 1 || corrections[0].Kind != CorrectionResend || corrections[0].StripeCustomerID != "cus_L" ||
		corrections[0].Status != "sent" || corrections[0].EventsSent != 1 || !corrections[0].WindowStart.Equal(hour) {
		t.Fatalf("want one re-send of cus_L's dropped minute in its hour %s, got %+v", hour, corrections)
	}
	if n := w.stripeEvents("cus_L", ls[0].Identifier); n != 1 {
		t.Fatalf("Stripe has %d events under the aggregate's identifier, want its re-send alone (the first was dropped)", n)
	}
	for cust, v := range map[string]int64{"cus_B": 12, "cus_L": 8} {
		if got := w.sim.MeterTotal(w.meter, cust); got != v {
			t.Errorf("Stripe bills %s %d units, want the %d delivered", cust, got, v)
		}
	}
	fs, err := a.Store().UsageFindings(context.Background(), UsageFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		if f.StripeCustomerID == "cus_B" {
			t.Fatalf("cus_B's minute buckets made a finding: %+v", f)
		}
	}
}
