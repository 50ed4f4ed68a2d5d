package audit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/stripeapi"
)

// Usage sent from the ledger (a meter consumer with --send-from-ledger):
// events are recorded queued at ingest, and a sum meter's events of one
// second may travel in one aggregate call under the aggregate's identifier.

const ledgerStream = "usage-ledger"

// ingest records events of cust queued, as a consumer does at ingest.
func (w *usageWorld) ingest(cust string, ts time.Time, values ...int64) []meterledger.Record {
	w.t.Helper()
	var reqs []meterledger.IngestRequest
	for i, v := range values {
		ev := event.MeterEvent{EventName: w.meter, StripeCustomerID: cust, Value: v, Timestamp: ts,
			EventID: fmt.Sprintf("%s-%s-%d", ts.Format(time.RFC3339Nano), cust, i)}
		reqs = append(reqs, meterledger.IngestRequest{Request: meterledger.Request{Event: ev, Identifier: ev.Identifier(testNS),
			MessageID: fmt.Sprintf("1-%d", i)}, Stream: ledgerStream, Fields: map[string]any{event.PayloadField: ev.Payload()}})
	}
	got, err := w.meters.Ingest(context.Background(), reqs)
	if err != nil {
		w.t.Fatal(err)
	}
	out := make([]meterledger.Record, len(got))
	for i, g := range got {
		if g.Decision != meterledger.Queued {
			w.t.Fatalf("ingest: %v %s", g.Decision, g.Reason)
		}
		out[i] = g.Record
	}
	return out
}

// aggregate forms cust's aggregate of ts's second, sends it to the
// emulator and records res for it.
func (w *usageWorld) aggregate(cust string, ts time.Time, res meterledger.Result) meterledger.Aggregate {
	w.t.Helper()
	ctx := context.Background()
	// The group's ingest watermark just past ts's second: its bucket (the
	// entries' ids are of 1970, so the bucket is ts's second) is formed.
	mark := time.Unix(ts.Unix()+1, 0)
	a, _, ok, err := w.meters.FormAggregate(ctx, testNS, ledgerStream, w.meter, cust, mark, time.Second, "test", time.Minute)
	if err != nil || !ok {
		w.t.Fatalf("forming the aggregate: ok=%v %v", ok, err)
	}
	if _, err := w.sc.SendMeterEvent(ctx, stripeapi.MeterEvent{EventName: w.meter, StripeCustomerID: cust, Value: a.Value,
		Identifier: a.Identifier, Timestamp: a.Second}); err != nil {
		w.t.Fatal(err)
	}
	if got, err := w.meters.FinishAggregate(ctx, a, res, "the reply was lost"); err != nil || got != res {
		w.t.Fatalf("finishing the aggregate: %v %v", got, err)
	}
	return a
}

// TestUsageQueuedAndAggregatedEventsAreNoDifference: in a reconciled hour,
// cus_Q has 5 units delivered and 10 queued (recorded, never sent); cus_G
// 8 units delivered in one aggregate of two events; cus_S an aggregate of
// 7 whose call reached Stripe and whose reply was lost (sending); cus_R 1
// unit delivered and an event of 9 queued when the ledger was read and
// sent by a sender before Stripe's summary was read (its row still queued). With auto-correct and
// three runs: no finding, no correction, and Stripe's totals are what was
// sent — queued events are unsent, never an over-count to cancel; an
// aggregate's members count once, as its value.
func TestUsageQueuedAndAggregatedEventsAreNoDifference(t *testing.T) {
	t.Parallel()
	w := setupUsage(t, stripesim.FormulaSum, stripesim.Faults{})
	hour := now.Add(-time.Hour)
	w.deliver("cus_Q", 5, hour.Add(10*time.Minute))
	w.ingest("cus_Q", hour.Add(20*time.Minute), 4, 6)
	w.ingest("cus_G", hour.Add(30*time.Minute), 3, 5)
	g := w.aggregate("cus_G", hour.Add(30*time.Minute), meterledger.Delivered)
	w.ingest("cus_S", hour.Add(40*time.Minute), 2, 5)
	s := w.aggregate("cus_S", hour.Add(40*time.Minute), meterledger.Release)
	w.deliver("cus_R", 1, hour.Add(45*time.Minute))
	r := w.ingest("cus_R", hour.Add(50*time.Minute), 9)[0]
	if _, err := w.sc.SendMeterEvent(context.Background(), stripeapi.MeterEvent{EventName: w.meter, StripeCustomerID: "cus_R", Value: 9,
		Identifier: r.Identifier, Timestamp: r.EventTS}); err != nil {
		t.Fatal(err)
	}
	if g.Value != 8 || g.Members != 2 || s.Value != 7 {
		t.Fatalf("aggregates %+v %+v: want 8 of 2 events and 7", g, s)
	}
	want := map[string]int64{"cus_Q": 5, "cus_G": 8, "cus_S": 7, "cus_R": 10}
	a := w.auditor(func(u *UsageConfig) { u.StableChecks = 1 })
	compared := int64(0)
	for range 3 {
		w.tick(15 * time.Minute)
		rep := w.run(a)
		compared += rep.WindowsCompared
		if rep.Suspect != 0 || rep.OpenFindings != 0 || len(rep.Corrections) != 0 {
			t.Fatalf("queued, aggregated and in-flight usage made a difference: %+v", rep)
		}
	}
	if compared < 4 {
		t.Fatalf("%d windows compared over three runs, want the four customers' hour compared", compared)
	}
	fs, err := a.Store().UsageFindings(context.Background(), UsageFilter{})
	if err != nil || len(fs) != 0 {
		t.Fatalf("want no usage finding, got %+v %v", fs, err)
	}
	cs, err := a.Store().UsageCorrections(context.Background(), 10)
	if err != nil || len(cs) != 0 {
		t.Fatalf("want no correction, got %+v %v", cs, err)
	}
	for cust, v := range want {
		if got := w.sim.MeterTotal(w.meter, cust); got != v {
			t.Errorf("Stripe bills %s %d units, want the %d sent", cust, got, v)
		}
	}
}

// TestUsageResendOfAnAggregatedWindowSendsTheAggregate: Stripe answers an
// event 200 and drops it, beside an aggregate of two events it counted.
// The under-count's re-send carries the window's delivered calls under the
// identifiers Stripe saw — the aggregate's, with its value, not its
// members' own (which Stripe never saw and would count again): Stripe
// refuses the aggregate as a duplicate, counts the dropped event, and the
// window ends at exactly what was delivered.
func TestUsageResendOfAnAggregatedWindowSendsTheAggregate(t *testing.T) {
	t.Parallel()
	w := setupUsage(t, stripesim.FormulaSum, stripesim.Faults{})
	hour := now.Add(-time.Hour)
	if err := w.sim.SetFaults(stripesim.Faults{RejectNextMeterEvents: 1}); err != nil {
		t.Fatal(err)
	}
	w.deliver("cus_D", 2, hour.Add(10*time.Minute))
	if len(w.sim.MeterErrorReports()) != 1 {
		t.Fatal("the emulator did not drop the event after its 200")
	}
	w.ingest("cus_D", hour.Add(20*time.Minute), 3, 4)
	g := w.aggregate("cus_D", hour.Add(20*time.Minute), meterledger.Delivered)
	if got := w.sim.MeterTotal(w.meter, "cus_D"); got != 7 {
		t.Fatalf("Stripe bills %d units before the correction, want the aggregate's 7", got)
	}
	a := w.auditor(nil)
	var corrections []UsageCorrection
	for range 4 {
		w.tick(15 * time.Minute)
		corrections = append(corrections, w.run(a).Corrections...)
	}
	if len(corrections) != 1 || corrections[0].Kind != CorrectionResend || corrections[0].Status != "sent" || corrections[0].EventsSent != 1 {
		t.Fatalf("want one re-send counted once (the dropped event; the aggregate refused as a duplicate), got %+v", corrections)
	}
	if got := w.sim.MeterTotal(w.meter, "cus_D"); got != 9 {
		t.Fatalf("Stripe bills %d units, want the 9 delivered (2 alone, 7 in aggregate %s)", got, g.Identifier)
	}
	if n := w.stripeEvents("cus_D", "pg_"); n != 1 {
		t.Fatalf("Stripe has %d events of cus_D under an event's own identifier, want the one sent alone (no member sent on its own)", n)
	}
}
