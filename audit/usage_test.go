package audit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/stripeapi"
)

// usageWorld is a meter at the emulator, pelguard's meter ledger and an
// auditor that reconciles them; the emulator's clock and the auditor's
// move together (tick).
type usageWorld struct {
	*bundle
	t      *testing.T
	meters *meterledger.Ledger
	sc     *stripeapi.Client
	meter  string
}

func setupUsage(t *testing.T, formula string, faults stripesim.Faults) *usageWorld {
	t.Helper()
	b := setup(t)
	if err := b.sim.SetFaults(faults); err != nil {
		t.Fatal(err)
	}
	ml, err := meterledger.New(b.pool, meterledger.Config{Schema: b.cfg.Schema, Clock: b.clk})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ml.EnsurePartitions(context.Background(), b.clk.Now()); err != nil {
		t.Fatal(err)
	}
	sc, err := stripeapi.New(b.cfg.Stripe)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: "api_calls", Formula: formula}); err != nil {
		t.Fatal(err)
	}
	return &usageWorld{bundle: b, t: t, meters: ml, sc: sc, meter: "api_calls"}
}

func (w *usageWorld) tick(d time.Duration) {
	w.clk.Advance(d)
	w.sim.Advance(d)
}

// deliver sends an event as the meter consumer does: reserved in the
// ledger, sent under its identifier, recorded delivered.
func (w *usageWorld) deliver(cust string, value int64, ts time.Time) string {
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
	if rec, err := w.meters.Finish(ctx, []meterledger.Outcome{{Hold: cl[0].Hold(), Result: meterledger.Delivered}}); err != nil || !rec[0] {
		w.t.Fatalf("finishing %s: %v %v", id, err, rec)
	}
	return id
}

// secondSender sends an event pelguard knows nothing of.
func (w *usageWorld) secondSender(cust string, value int64, ts time.Time, id string) {
	w.t.Helper()
	if _, err := w.sc.SendMeterEvent(context.Background(), stripeapi.MeterEvent{EventName: w.meter, StripeCustomerID: cust, Value: value, Identifier: id, Timestamp: ts}); err != nil {
		w.t.Fatal(err)
	}
}

func (w *usageWorld) auditor(mod func(*UsageConfig)) *Auditor {
	return w.bundle.auditor(w.t, func(c *Config) {
		c.Usage = UsageConfig{SettleDelay: 10 * time.Minute, StableChecks: 2, AutoCorrect: true}
		if mod != nil {
			mod(&c.Usage)
		}
	})
}

func (w *usageWorld) run(a *Auditor) UsageReport {
	w.t.Helper()
	rep, err := a.ReconcileUsage(context.Background())
	if err != nil {
		w.t.Fatal(err)
	}
	return rep
}

// stripeEvents counts the events Stripe recorded for cust whose identifier
// starts with prefix.
func (w *usageWorld) stripeEvents(cust, prefix string) int {
	n := 0
	for _, e := range w.sim.MeterEvents(w.meter, cust) {
		if strings.HasPrefix(e.Identifier, prefix) {
			n++
		}
	}
	return n
}

// TestUsageOverCountBySecondSender: another sender adds 3 units to a
// customer's hour; summaries lag 30 minutes. Before the hour settles
// nothing is compared; while the summary is still behind the run sees an
// under-count that never becomes a finding; once the difference is stable
// it is usage_over, corrected once by an event of the opposite sign, never
// again while the summary catches up, and resolved when it has.
func TestUsageOverCountBySecondSender(t *testing.T) {
	t.Parallel()
	w := setupUsage(t, stripesim.FormulaSum, stripesim.Faults{MeterSummaryLag: 30 * time.Minute})
	hour := now.Add(-time.Hour) // [11:00, 12:00)
	w.deliver("cus_A", 5, hour.Add(30*time.Minute))
	w.deliver("cus_A", 7, hour.Add(50*time.Minute))
	w.secondSender("cus_A", 3, hour.Add(40*time.Minute), "other-sender-1")
	a := w.auditor(nil)

	// 12:05: the hour ended 5 minutes ago, less than the settle delay.
	w.tick(5 * time.Minute)
	if rep := w.run(a); rep.WindowsCompared != 0 || rep.Suspect != 0 || rep.OpenFindings != 0 {
		t.Fatalf("unsettled window compared: %+v", rep)
	}
	// 12:15: settled, but Stripe's summary shows nothing yet (lag).
	w.tick(10 * time.Minute)
	rep := w.run(a)
	if rep.WindowsCompared != 1 || rep.Suspect != 1 || rep.OpenFindings != 0 {
		t.Fatalf("12:15: want one suspect window, got %+v", rep)
	}
	if fs, _ := a.Store().UsageFindings(context.Background(), UsageFilter{}); len(fs) != 1 || fs[0].Kind != UsageUnder || fs[0].State != "suspect" {
		t.Fatalf("12:15: want a suspect under-count, got %+v", fs)
	}
	// 12:35: the summary caught up: 15 at Stripe, 12 delivered. A new
	// difference starts its checks again.
	w.tick(20 * time.Minute)
	if rep := w.run(a); rep.Suspect != 1 || rep.OpenFindings != 0 {
		t.Fatalf("12:35: want still suspect, got %+v", rep)
	}
	// 12:50: the same difference again: a finding, corrected.
	w.tick(15 * time.Minute)
	rep = w.run(a)
	if rep.OpenFindings != 1 || rep.Findings[0].Kind != UsageOver || rep.Findings[0].Delta() != 3 || !rep.Findings[0].New {
		t.Fatalf("12:50: want one new usage_over of 3, got %+v", rep.Findings)
	}
	if len(rep.Corrections) != 1 || rep.Corrections[0].Kind != CorrectionNegativeEvent || rep.Corrections[0].Status != "sent" ||
		rep.Corrections[0].Units != -3 {
		t.Fatalf("12:50: want one negative event of -3 sent, got %+v", rep.Corrections)
	}
	if n := w.stripeEvents("cus_A", "pgc_"); n != 1 {
		t.Fatalf("correction events at Stripe: %d, want 1", n)
	}
	if got := w.mem.Alerts(); len(got) != 1 || !strings.Contains(got[0].Title, "usage run") {
		t.Fatalf("want one usage alert, got %+v", got)
	}
	// 13:00: the correction is not in the summary yet: the finding stays
	// open, and is not corrected twice.
	w.tick(10 * time.Minute)
	rep = w.run(a)
	if rep.OpenFindings != 1 || len(rep.Corrections) != 0 || w.stripeEvents("cus_A", "pgc_") != 1 {
		t.Fatalf("13:00: want the finding open and no second correction, got %+v, %d", rep, w.stripeEvents("cus_A", "pgc_"))
	}
	// 13:25: the summary shows the correction: resolved.
	w.tick(25 * time.Minute)
	rep = w.run(a)
	if rep.OpenFindings != 0 || len(rep.Resolved) != 1 || rep.Resolved[0].Resolution != "totals agree after the correction" {
		t.Fatalf("13:25: want the finding resolved by its correction, got %+v", rep)
	}
	if got := w.sim.MeterTotal(w.meter, "cus_A"); got != 12 {
		t.Fatalf("Stripe bills %d units, want the 12 delivered", got)
	}
	if n := w.stripeEvents("cus_A", "pgc_"); n != 1 {
		t.Fatalf("correction events at Stripe: %d, want 1", n)
	}
}

// TestUsageUnderCountDroppedAfter200: Stripe answers 200 to one of three
// events and drops it (as its asynchronous validation does). The finding
// is usage_under once settled and stable; its correction is recorded and
// the process "crashes" before the call; the next run makes it once (the
// window's events sent again under their own identifiers: Stripe refuses
// the two it has and counts the dropped one), and no run makes it again.
func TestUsageUnderCountDroppedAfter200(t *testing.T) {
	t.Parallel()
	w := setupUsage(t, stripesim.FormulaSum, stripesim.Faults{MeterSummaryLag: 30 * time.Minute})
	hour := now.Add(-time.Hour)
	w.deliver("cus_B", 2, hour.Add(10*time.Minute))
	if err := w.sim.SetFaults(stripesim.Faults{MeterSummaryLag: 30 * time.Minute, RejectNextMeterEvents: 1}); err != nil {
		t.Fatal(err)
	}
	w.deliver("cus_B", 4, hour.Add(20*time.Minute))
	w.deliver("cus_B", 8, hour.Add(30*time.Minute))
	if len(w.sim.MeterErrorReports()) != 1 {
		t.Fatal("the emulator did not drop an event after its 200")
	}
	crash := true
	a := w.bundle.auditor(t, func(c *Config) {
		c.Usage = UsageConfig{SettleDelay: 10 * time.Minute, StableChecks: 2, AutoCorrect: true}
		c.Test.AfterUsageCorrectionRecorded = func(UsageCorrection) error {
			if crash {
				return errors.New("killed between the record and the call")
			}
			return nil
		}
	})
	w.tick(35 * time.Minute) // 12:35: settled and visible
	if rep := w.run(a); rep.Suspect != 1 || rep.OpenFindings != 0 {
		t.Fatalf("first sight: want suspect, got %+v", rep)
	}
	before := w.sim.MeterEventCounts()
	w.tick(10 * time.Minute)
	if _, err := a.ReconcileUsage(context.Background()); err == nil {
		t.Fatal("the crash hook did not stop the run")
	}
	if got := w.sim.MeterEventCounts(); got != before {
		t.Fatalf("a call was made before the crash: %+v → %+v", before, got)
	}
	cs, err := a.Store().UsageCorrections(context.Background(), 10)
	if err != nil || len(cs) != 1 || cs[0].Status != "recorded" || cs[0].Kind != CorrectionResend || cs[0].Units != 4 {
		t.Fatalf("want one recorded resend of 4 units, got %+v %v", cs, err)
	}
	crash = false
	w.tick(5 * time.Minute)
	rep := w.run(a)
	if len(rep.Corrections) != 1 || rep.Corrections[0].Status != "sent" || rep.Corrections[0].EventsSent != 1 {
		t.Fatalf("want the recorded correction carried out once, got %+v", rep.Corrections)
	}
	if got := w.sim.MeterTotal(w.meter, "cus_B"); got != 14 {
		t.Fatalf("Stripe bills %d units, want the 14 delivered", got)
	}
	after := w.sim.MeterEventCounts()
	if after.Recorded != before.Recorded+1 || after.Duplicates != before.Duplicates+2 {
		t.Fatalf("want one event recorded and two refused as duplicates, got %+v → %+v", before, after)
	}
	// Runs go on while the summary catches up: nothing is sent again.
	for range 3 {
		w.tick(15 * time.Minute)
		rep = w.run(a)
		if len(rep.Corrections) != 0 {
			t.Fatalf("corrected twice: %+v", rep.Corrections)
		}
	}
	if rep.OpenFindings != 0 || w.sim.MeterEventCounts().Recorded != after.Recorded {
		t.Fatalf("want resolved and nothing more sent, got %+v", rep)
	}
	if fs, _ := a.Store().UsageFindings(context.Background(), UsageFilter{State: "resolved"}); len(fs) != 1 || fs[0].Resolution != "totals agree after the correction" {
		t.Fatalf("want the finding resolved by its correction, got %+v", fs)
	}
}

// TestUsageLateEventResolves: a summary that lags longer than the settle
// delay and the re-checks makes an open usage_under; the re-send it calls
// for is refused by Stripe (every identifier is still guarded), so nothing
// counts twice, and once the late events show the finding resolves.
func TestUsageLateEventResolves(t *testing.T) {
	t.Parallel()
	w := setupUsage(t, stripesim.FormulaSum, stripesim.Faults{MeterSummaryLag: 2 * time.Hour})
	hour := now.Add(-time.Hour)
	w.deliver("cus_C", 6, hour.Add(45*time.Minute))
	a := w.auditor(nil)
	w.tick(15 * time.Minute)
	w.run(a)
	w.tick(15 * time.Minute)
	rep := w.run(a)
	if rep.OpenFindings != 1 || rep.Findings[0].Kind != UsageUnder {
		t.Fatalf("want an open usage_under, got %+v", rep)
	}
	if len(rep.Corrections) != 1 || rep.Corrections[0].EventsSent != 0 || rep.Corrections[0].Status != "sent" {
		t.Fatalf("want a re-send that Stripe refused as a duplicate, got %+v", rep.Corrections)
	}
	w.tick(2 * time.Hour)
	rep = w.run(a)
	if rep.OpenFindings != 0 || len(rep.Resolved) != 1 {
		t.Fatalf("want the late event to resolve the finding, got %+v", rep)
	}
	if got := w.sim.MeterTotal(w.meter, "cus_C"); got != 6 {
		t.Fatalf("Stripe bills %d units, want 6", got)
	}
}

// TestUsageNothingCorrectedPastInvoice: an over-count in the last hour of
// November, found on December 1st after the invoice's grace period: the
// finding names the credit a person must give, and no event is sent.
func TestUsageNothingCorrectedPastInvoice(t *testing.T) {
	t.Parallel()
	w := setupUsage(t, stripesim.FormulaSum, stripesim.Faults{})
	lastHour := time.Date(2026, 11, 30, 23, 0, 0, 0, time.UTC)
	w.deliver("cus_D", 10, lastHour.Add(10*time.Minute))
	w.secondSender("cus_D", 4, lastHour.Add(20*time.Minute), "other-sender-2")
	a := w.auditor(func(u *UsageConfig) { u.StableChecks = 1 })
	rep := w.run(a)
	if rep.OpenFindings != 1 || rep.Findings[0].Delta() != 4 {
		t.Fatalf("want one open over-count of 4, got %+v", rep)
	}
	if len(rep.Corrections) != 0 || w.stripeEvents("cus_D", "pgc_") != 0 {
		t.Fatalf("corrected past the invoice's finalisation: %+v", rep.Corrections)
	}
	if m := rep.Findings[0].ManualAction; !strings.Contains(m, "credit the customer 4 units") || !strings.Contains(m, "finalized") {
		t.Fatalf("manual action %q does not name the credit", m)
	}
}

// TestUsageOverNotCorrectedOverParkedEvents: an event Stripe counted is
// recorded parked (as a ledger repair parks events whose acks a rollback
// lost past Stripe's identifier window): Stripe is over the delivered total
// by its units, which the ledger's interval [5, 8] covers, so auto-correct
// sends no negative event for it (invariant 13) and reports no over-count.
func TestUsageOverNotCorrectedOverParkedEvents(t *testing.T) {
	t.Parallel()
	w := setupUsage(t, stripesim.FormulaSum, stripesim.Faults{})
	hour := now.Add(-2 * time.Hour)
	w.deliver("cus_P", 5, hour.Add(10*time.Minute))
	ctx := context.Background()
	ev := event.MeterEvent{EventName: w.meter, StripeCustomerID: "cus_P", Value: 3, Timestamp: hour.Add(20 * time.Minute), EventID: "parked-1"}
	id := ev.Identifier(testNS)
	cl, err := w.meters.Reserve(ctx, []meterledger.Request{{Event: ev, Identifier: id, Owner: "test", Lease: time.Minute, MessageID: "2-0"}})
	if err != nil || !cl[0].Decision.MaySend() {
		t.Fatalf("reserving: %v %+v", err, cl)
	}
	if _, err := w.sc.SendMeterEvent(ctx, stripeapi.MeterEvent{EventName: w.meter, StripeCustomerID: "cus_P", Value: 3, Identifier: id, Timestamp: ev.Timestamp}); err != nil {
		t.Fatal(err)
	}
	if rec, err := w.meters.Finish(ctx, []meterledger.Outcome{{Hold: cl[0].Hold(), Result: meterledger.Park, Reason: "outcome unknown"}}); err != nil || !rec[0] {
		t.Fatalf("parking: %v %v", err, rec)
	}
	a := w.auditor(func(u *UsageConfig) { u.StableChecks = 1 })
	rep := w.run(a)
	if rep.OpenFindings != 0 {
		t.Fatalf("Stripe's 8 is inside the ledger's interval [5, 8]: want no open finding, got %+v", rep.Findings)
	}
	if len(rep.Corrections) != 0 || w.stripeEvents("cus_P", "pgc_") != 0 || w.sim.MeterTotal(w.meter, "cus_P") != 8 {
		t.Fatalf("a parked event's units were taken back: corrections %+v, Stripe bills %d", rep.Corrections, w.sim.MeterTotal(w.meter, "cus_P"))
	}
}

// TestUsageMeterFormulas: a count meter compares delivered events with
// Stripe's count; a last meter is left out with the reason.
func TestUsageMeterFormulas(t *testing.T) {
	t.Parallel()
	w := setupUsage(t, stripesim.FormulaCount, stripesim.Faults{})
	hour := now.Add(-time.Hour)
	w.deliver("cus_E", 50, hour.Add(5*time.Minute))
	w.deliver("cus_E", 70, hour.Add(6*time.Minute))
	w.secondSender("cus_E", 1, hour.Add(7*time.Minute), "other-sender-3")
	if _, err := w.sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: "seats", Formula: stripesim.FormulaLast}); err != nil {
		t.Fatal(err)
	}
	w.meter = "seats"
	w.deliver("cus_E", 3, hour.Add(5*time.Minute))
	w.meter = "api_calls"
	w.tick(15 * time.Minute)
	rep := w.run(w.auditor(func(u *UsageConfig) { u.StableChecks = 1 }))
	if !strings.Contains(rep.Skipped["seats"], "last") {
		t.Fatalf("the last meter was not left out with its reason: %+v", rep.Skipped)
	}
	if rep.OpenFindings != 1 || rep.Findings[0].Measure != "count" || rep.Findings[0].LedgerValue != 2 || rep.Findings[0].StripeValue != 3 {
		t.Fatalf("want a count over-count 2 vs 3, got %+v", rep.Findings)
	}
	if len(rep.Corrections) != 0 || !strings.Contains(rep.Findings[0].ManualAction, "count meter") {
		t.Fatalf("a count meter's over-count must be left to a person: %+v", rep.Findings[0])
	}
}

// TestUsageScheduled: with Usage.Enabled a scheduled run reconciles meters
// after the charges' audit, and the metrics show the drift.
func TestUsageScheduled(t *testing.T) {
	t.Parallel()
	w := setupUsage(t, stripesim.FormulaSum, stripesim.Faults{})
	hour := now.Add(-time.Hour)
	w.deliver("cus_F", 4, hour.Add(5*time.Minute))
	w.secondSender("cus_F", 3, hour.Add(6*time.Minute), "other-sender-4")
	w.tick(15 * time.Minute)
	a := w.auditor(func(u *UsageConfig) { u.StableChecks, u.Enabled, u.AutoCorrect = 1, true, false })
	reg := prometheus.NewRegistry()
	metrics := NewMetrics(reg)
	s, err := a.NewScheduler("@hourly", metrics.Observe)
	if err != nil {
		t.Fatal(err)
	}
	var got []UsageReport
	s.OnUsage(func(r UsageReport, err error) {
		if err != nil {
			t.Errorf("usage run: %v", err)
		}
		got = append(got, r)
		metrics.ObserveUsage(r, err)
	})
	s.runOnce(context.Background())
	if len(got) != 1 || got[0].OpenFindings != 1 {
		t.Fatalf("want one usage run with one open finding, got %+v", got)
	}
	if v := testutil.ToFloat64(metrics.usage.drift.WithLabelValues(string(UsageOver))); v != 3 {
		t.Fatalf("pelguard_auditor_usage_drift_units{kind=usage_over} = %v, want 3", v)
	}
	if m := got[0].Findings[0].ManualAction; !strings.Contains(m, "value -3") || !strings.Contains(m, "would do") {
		t.Fatalf("without auto-correct the finding names the correction: %q", m)
	}
	if n := w.stripeEvents("cus_F", "pgc_"); n != 0 {
		t.Fatalf("corrected without --usage-auto-correct: %d events", n)
	}
}
