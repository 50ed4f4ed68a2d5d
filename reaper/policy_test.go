package reaper_test

import (
	"context"
	"testing"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/stripesim"
)

// Issue 25 item 5: a soft decline met in a re-drive follows the fleet's
// policy. With retries off (--decline-retries 0 on every role) it is
// final, with one alert, and never charged again; before, the re-drive's
// processor had no policy and scheduled a retry that the fleet had turned
// off.
func TestRedriveFollowsFleetDeclinePolicy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e := ev(3)
	if err := b.sim.SetFaults(stripesim.Faults{DeclineCodes: map[string]string{e.StripeCustomerID: "insufficient_funds"}}); err != nil {
		t.Fatal(err)
	}
	b.add(t, e)
	b.read(t, deadName, 10)
	b.waitIdle(t, 1, 0)
	cfg := b.config(t, "reaper-a")
	cfg.Retry = consumer.RetryPolicy{Retries: consumer.NoDeclineRetries}
	sum, err := b.newReaper(t, cfg).RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Outcomes[consumer.OutcomeDeclined] != 1 {
		t.Fatalf("summary %+v, want one re-drive declined", sum)
	}
	rec, ok := b.get(t, e)
	if !ok || !rec.NextAttemptAt.IsZero() {
		t.Fatalf("retries are off for the fleet: the re-drive scheduled one anyway: %+v", rec)
	}
	declines := 0
	for _, a := range b.notifier.Alerts() {
		if a.Kind == alerts.KindChargeDeclined {
			declines++
		}
	}
	if declines != 1 {
		t.Fatalf("%d charge_declined alerts, want 1 (a final decline)", declines)
	}
}
