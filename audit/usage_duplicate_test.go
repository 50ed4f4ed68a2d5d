package audit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/stripeapi"
)

// TestUsageCorrectionRefusedAsDuplicateIsNotSent: Stripe already holds the
// identifier a correction is about to use (here: the other sender's very
// event). Its refusal as a duplicate on the correction's first call is not
// success: the correction is failed, not sent, and the finding names the
// correction a person must make.
func TestUsageCorrectionRefusedAsDuplicateIsNotSent(t *testing.T) {
	t.Parallel()
	w := setupUsage(t, stripesim.FormulaSum, stripesim.Faults{})
	hour := now.Add(-time.Hour)
	w.deliver("cus_DUP", 10, hour.Add(10*time.Minute))
	id := correctionIdentifier("pgc_", UsageFinding{EventName: w.meter, StripeCustomerID: "cus_DUP", WindowStart: hour, WindowEnd: now}, 1)
	// Under an idempotency key of its own: Stripe refuses the correction's
	// identifier, not its key.
	if _, err := w.sc.SendMeterEvent(context.Background(), stripeapi.MeterEvent{EventName: w.meter, StripeCustomerID: "cus_DUP", Value: 3,
		Identifier: id, Timestamp: hour.Add(20 * time.Minute), IdempotencyKey: "other-sender-key"}); err != nil {
		t.Fatal(err)
	}
	a := w.auditor(func(u *UsageConfig) { u.StableChecks = 1 })
	w.tick(15 * time.Minute)
	rep := w.run(a)
	if len(rep.Corrections) != 1 || rep.Corrections[0].Status != "failed" || rep.Corrections[0].EventsSent != 0 {
		t.Fatalf("want the correction failed (its identifier refused as a duplicate on its first call), got %+v", rep.Corrections)
	}
	fs, err := a.Store().UsageFindings(context.Background(), UsageFilter{State: "open"})
	if err != nil || len(fs) != 1 || !strings.Contains(fs[0].ManualAction, "correct by hand") {
		t.Fatalf("want the finding open and named for a person, got %+v %v", fs, err)
	}
	if got := w.sim.MeterTotal(w.meter, "cus_DUP"); got != 13 {
		t.Fatalf("Stripe bills %d, want 13 (nothing counted by the refused correction)", got)
	}
}
