package audit

import (
	"context"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/stripesim"
)

// TestUsageSettlesByDelivery: a backlog delivers two events of the 08:00
// hour at 12:00; Stripe's summaries lag the delivery by 30 minutes, the
// settle delay is 45. Nothing is compared until the delivery settled: no
// finding, no alert, no correction spent on a summary that is merely
// behind. Another sender then adds 3 units to that hour: one usage_over of
// 3, corrected once; it resolves when Stripe shows the correction, and the
// resolved finding shows its resolution, not advice.
func TestUsageSettlesByDelivery(t *testing.T) {
	t.Parallel()
	w := setupUsage(t, stripesim.FormulaSum, stripesim.Faults{MeterSummaryLag: 30 * time.Minute})
	hour := now.Add(-4 * time.Hour) // [08:00, 09:00), delivered at 12:00
	w.deliver("cus_S", 6, hour.Add(10*time.Minute))
	w.deliver("cus_S", 5, hour.Add(30*time.Minute))
	a := w.auditor(func(u *UsageConfig) { u.SettleDelay = 45 * time.Minute })
	ctx := context.Background()
	for i := range 3 { // 12:15, 12:25, 12:35: the delivery has not settled
		w.tick(map[bool]time.Duration{true: 15 * time.Minute, false: 10 * time.Minute}[i == 0])
		if i == 1 {
			w.secondSender("cus_S", 3, hour.Add(40*time.Minute), "other-sender-s") // received 12:25, shown 12:55
		}
		rep := w.run(a)
		if fs, _ := a.Store().UsageFindings(ctx, UsageFilter{}); len(fs) != 0 || len(rep.Corrections) != 0 {
			t.Errorf("%s: the delivery has not settled, want no finding and no correction, got %+v %+v",
				w.clk.Now().Format("15:04"), fs, rep.Corrections)
		}
	}
	for range 14 { // 12:45 … 14:55
		w.tick(10 * time.Minute)
		w.run(a)
	}
	fs, err := a.Store().UsageFindings(ctx, UsageFilter{})
	if err != nil || len(fs) != 1 || fs[0].Kind != UsageOver || fs[0].Delta() != 3 && fs[0].State != "resolved" {
		t.Fatalf("want one usage_over of 3, got %+v %v", fs, err)
	}
	cs, err := a.Store().UsageCorrections(ctx, 10)
	if err != nil || len(cs) != 1 || cs[0].Kind != CorrectionNegativeEvent || cs[0].Units != -3 || cs[0].Status != "sent" {
		t.Fatalf("want the over-count corrected once by -3, got %+v %v", cs, err)
	}
	if got := w.sim.MeterTotal(w.meter, "cus_S"); got != 11 {
		t.Fatalf("Stripe bills %d units, want the 11 delivered", got)
	}
	if fs[0].State != "resolved" || fs[0].Resolution != "totals agree after the correction" || fs[0].ManualAction != "" {
		t.Fatalf("want the finding resolved by its correction and no advice left, got %+v", fs[0])
	}
}
