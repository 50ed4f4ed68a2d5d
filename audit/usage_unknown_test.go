package audit

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/stripeapi"
)

// sendUnknown sends an event that reaches Stripe and ends with an unknown
// outcome in the ledger: its reply lost (the row stays sending, released),
// or parked (a person must look).
func (w *usageWorld) sendUnknown(cust string, value int64, ts time.Time, res meterledger.Result) string {
	w.t.Helper()
	ctx := context.Background()
	ev := event.MeterEvent{EventName: w.meter, StripeCustomerID: cust, Value: value, Timestamp: ts, EventID: ts.Format(time.RFC3339Nano) + cust}
	id := ev.Identifier(testNS)
	cl, err := w.meters.Reserve(ctx, []meterledger.Request{{Event: ev, Identifier: id, Owner: "test", Lease: time.Minute, MessageID: "1-0"}})
	if err != nil || !cl[0].Decision.MaySend() {
		w.t.Fatalf("reserving %s: %v %+v", id, err, cl)
	}
	if _, err := w.sc.SendMeterEvent(ctx, stripeapi.MeterEvent{EventName: w.meter, StripeCustomerID: cust, Value: value, Identifier: id, Timestamp: ts}); err != nil {
		w.t.Fatal(err)
	}
	out := meterledger.Outcome{Hold: cl[0].Hold(), Result: res, Reason: "the reply was lost"}
	if rec, err := w.meters.Finish(ctx, []meterledger.Outcome{out}); err != nil || !rec[0] {
		w.t.Fatalf("finishing %s: %v %v", id, err, rec)
	}
	return id
}

// TestUsageAutoCorrectLeavesUnknownEventsCounted: of 16 units pelguard
// sent, 5 are delivered, 7 are still sending (the reply was lost) and 4
// parked; all reached Stripe, and another sender adds 3. Stripe counts 19.
// The ledger knows the window holds [5, 16]: the difference is the 3
// outside it, corrected by -3, never by taking back the unknown 11; the
// finding names the two unknown events and what to check, and once Stripe
// shows 16 the finding resolves.
func TestUsageAutoCorrectLeavesUnknownEventsCounted(t *testing.T) {
	t.Parallel()
	w := setupUsage(t, stripesim.FormulaSum, stripesim.Faults{})
	hour := now.Add(-time.Hour)
	w.deliver("cus_U", 5, hour.Add(10*time.Minute))
	sending := w.sendUnknown("cus_U", 7, hour.Add(20*time.Minute), meterledger.Release)
	parked := w.sendUnknown("cus_U", 4, hour.Add(30*time.Minute), meterledger.Park)
	w.secondSender("cus_U", 3, hour.Add(40*time.Minute), "other-sender-u")
	a := w.auditor(nil)
	var rep UsageReport
	var open bytes.Buffer // the finding as its run reported it, open
	for range 3 {
		w.tick(15 * time.Minute)
		rep = w.run(a)
		if len(rep.Findings) > 0 && open.Len() == 0 {
			if err := WriteUsageFindings(&open, rep.Findings); err != nil {
				t.Fatal(err)
			}
		}
		if got := w.sim.MeterTotal(w.meter, "cus_U"); got < 16 {
			t.Fatalf("Stripe bills %d units, below the 16 pelguard sent (corrections %+v)", got, rep.Corrections)
		}
	}
	fs, err := a.Store().UsageFindings(context.Background(), UsageFilter{})
	if err != nil || len(fs) != 1 || fs[0].Kind != UsageOver {
		t.Fatalf("want one usage_over finding, got %+v %v", fs, err)
	}
	cs, err := a.Store().UsageCorrections(context.Background(), 10)
	if err != nil || len(cs) != 1 || cs[0].Units != -3 || cs[0].Status != "sent" {
		t.Fatalf("want one correction of -3 units, got %+v %v", cs, err)
	}
	if got := w.sim.MeterTotal(w.meter, "cus_U"); got != 16 {
		t.Fatalf("Stripe bills %d units, want the 16 pelguard sent", got)
	}
	for _, want := range []string{sending, parked, "sending", "parked", "meter-settle"} {
		if !strings.Contains(open.String(), want) {
			t.Errorf("the open finding does not name %q:\n%s", want, open.String())
		}
	}
	if fs[0].State != "resolved" {
		t.Fatalf("want the finding resolved once Stripe shows the 16 units, got %+v", fs[0])
	}
}
