package audit

import (
	"context"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/stripesim"
)

// TestUsageReDriftIsCorrectedAgain: another sender over-counts a window,
// pelguard corrects it and the totals agree; then the window drifts again.
// While the invoice is open and the window has had fewer corrections than
// --usage-max-window-corrections, each drift is corrected by a correction
// of its own identifier; past the limit, or once the invoice is final, the
// finding names what a person must do.
func TestUsageReDriftIsCorrectedAgain(t *testing.T) {
	t.Parallel()
	w := setupUsage(t, stripesim.FormulaSum, stripesim.Faults{})
	hour := now.Add(-time.Hour)
	for _, c := range []string{"cus_R", "cus_Q"} {
		w.deliver(c, 10, hour.Add(10*time.Minute))
		w.secondSender(c, 3, hour.Add(20*time.Minute), "drift-1-"+c)
	}
	a := w.auditor(func(u *UsageConfig) {
		u.StableChecks = 1
		u.MaxWindowCorrections = 2
		u.InvoiceClosesAt = func(c string, ts time.Time) time.Time {
			if c == "cus_Q" {
				return now.Add(40 * time.Minute) // cus_Q's invoice is final at 12:40
			}
			return time.Date(2027, 1, 1, 1, 0, 0, 0, time.UTC)
		}
	})
	ctx := context.Background()
	total := func(c string) int64 { return w.sim.MeterTotal(w.meter, c) }
	w.tick(15 * time.Minute) // 12:15: both corrected
	w.run(a)
	w.tick(15 * time.Minute) // 12:30: both agree
	w.run(a)
	if total("cus_R") != 10 || total("cus_Q") != 10 {
		t.Fatalf("after the first correction Stripe bills %d and %d, want 10 each", total("cus_R"), total("cus_Q"))
	}
	for _, c := range []string{"cus_R", "cus_Q"} {
		w.secondSender(c, 2, hour.Add(30*time.Minute), "drift-2-"+c)
	}
	w.tick(15 * time.Minute) // 12:45: cus_R corrected again; cus_Q's invoice is final
	w.run(a)
	w.tick(15 * time.Minute) // 13:00
	w.run(a)
	if got := total("cus_R"); got != 10 {
		t.Errorf("after the re-drift Stripe bills cus_R %d, want 10 (corrected again)", got)
	}
	if got := total("cus_Q"); got != 12 {
		t.Errorf("Stripe bills cus_Q %d, want 12 (nothing sent past the invoice)", got)
	}
	if fs, _ := a.Store().UsageFindings(ctx, UsageFilter{StripeCustomerID: "cus_Q"}); len(fs) != 1 || fs[0].State != "open" ||
		!contains(fs[0].ManualAction, "credit the customer 2 units") {
		t.Errorf("want cus_Q's re-drift open and named for a person, got %+v", fs)
	}
	w.secondSender("cus_R", 1, hour.Add(40*time.Minute), "drift-3-cus_R")
	w.tick(15 * time.Minute) // 13:15: a third drift, past the limit of 2
	w.run(a)
	if got := total("cus_R"); got != 11 {
		t.Errorf("Stripe bills cus_R %d, want 11 (the third drift left to a person)", got)
	}
	fs, _ := a.Store().UsageFindings(ctx, UsageFilter{StripeCustomerID: "cus_R"})
	if len(fs) != 1 || fs[0].State != "open" || fs[0].Delta() != 1 || !contains(fs[0].ManualAction, "max-window-corrections") {
		t.Errorf("want cus_R's third drift open and named for a person, got %+v", fs)
	}
	cs, err := a.Store().UsageCorrections(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, c := range cs {
		if ids[c.Identifier] {
			t.Errorf("identifier %s used twice", c.Identifier)
		}
		ids[c.Identifier] = true
	}
	if len(cs) != 3 {
		t.Errorf("want 3 corrections (cus_R twice, cus_Q once), got %+v", cs)
	}
}

func contains(s, sub string) bool { return len(sub) == 0 || len(s) >= len(sub) && indexOf(s, sub) >= 0 }

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}
