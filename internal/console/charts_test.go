package console

import (
	"context"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/ledger"
)

// The billing chart counts the ledger's charges per hour: an hour that is
// over is counted once it settled and then served from the cache, and the
// current hour is counted on every refresh.
func TestChartsCountTheCurrentHourEachRefresh(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	seed := func(cust string, at time.Time) {
		t.Helper()
		if _, err := b.ledger.SeedForTest(ctx, []ledger.Record{{Key: ledger.Key{CustomerID: cust, BillingPeriod: testPeriod},
			StripeCustomerID: "cus_" + cust, AmountCents: 2500, IdempotencyKey: key(cust), ChargeID: "ch_" + cust,
			FirstAttemptAt: at, ChargedAt: at}}); err != nil {
			t.Fatal(err)
		}
	}
	charged := regexp.MustCompile(`<span class="key k0"></span>charged (\d+) `)
	total := func(c *client) string {
		t.Helper()
		m := charged.FindStringSubmatch(c.mustGet("/"))
		if m == nil {
			t.Fatal("no billing chart on the overview")
		}
		return m[1]
	}
	seed("early", now.Add(-150*time.Minute)) // 09:30
	seed("late", now.Add(-30*time.Minute))   // 11:30
	seed("old", now.Add(-30*time.Hour))      // before the chart's day
	alice := b.login(t, "alice")
	if got := total(alice); got != "2" {
		t.Fatalf("charged in the last day: %s, want 2", got)
	}
	// Half an hour later: a charge in the current hour is counted at once;
	// one written late into 09:00-10:00, an hour that had settled when it
	// was counted, is not (the cache), nor is anything counted twice.
	b.clk.Set(now.Add(30 * time.Minute))
	seed("now", now.Add(10*time.Minute))
	seed("backdated", now.Add(-140*time.Minute))
	if got := total(alice); got != "3" {
		t.Fatalf("after a charge in the current hour: %s, want 3 (2 cached + 1 now)", got)
	}
	if got := total(alice); got != "3" {
		t.Fatalf("a second refresh: %s, want 3", got)
	}
	// A fresh process counts the whole day again.
	s, err := New(b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	start := s.now().Truncate(time.Hour).Add(-(chartHours - 1) * time.Hour)
	cs, err := s.charts(ctx, []string{testPeriod})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(cs[0].Total[0]); got != "{charged 4}" {
		t.Fatalf("a new console's count from %s: %s, want {charged 4}", start, got)
	}
}
