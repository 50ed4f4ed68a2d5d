package reaper_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/teamsys"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/reaper"
	"github.com/pelguard/pelguard/stripeapi"
)

// Reclaim while in flight, with a consumer that has no heartbeat: the
// article's Python consumer, live, inside Stripe calls slower than the
// reaper's min-idle. pelguard's reaper beside it re-drives none of its
// entries (it never registered as a pelguard consumer), says so once, and
// every customer is charged once, by the team. Told the consumer is stopped
// (--stopped-consumers) the same reaper does claim them: the control that
// shows the guard is what holds.
func TestReaperLeavesAnUnregisteredLiveConsumerAlone(t *testing.T) {
	t.Parallel()
	for _, stopped := range []bool{false, true} {
		t.Run(fmt.Sprintf("stopped=%v", stopped), func(t *testing.T) {
			t.Parallel()
			env := teamsys.Setup(t)
			if err := env.Sim.SetFaults(stripesim.Faults{Latency: stripesim.Latency{Fixed: 1500 * time.Millisecond}}); err != nil {
				t.Fatal(err)
			}
			b := setup(t) // pelguard's ledger, in a schema of its own
			sc, err := stripeapi.New(stripeapi.Config{APIKey: teamsys.DefaultStripeKey, BaseURL: env.Sim.URL(), Mode: stripeapi.ModeCharges, MaxNetworkRetries: stripeapi.NoRetries})
			if err != nil {
				t.Fatal(err)
			}
			const n = 3
			for i := range n {
				env.Publish(t, event.Event{CustomerID: fmt.Sprintf("c_%d", i), StripeCustomerID: fmt.Sprintf("cus_%d", i),
					AmountCents: int64(100 + i), BillingPeriod: "2026-11", Currency: "usd"})
			}
			cfg := b.config(t, "reaper-under-test")
			cfg.Stripe, cfg.Streams = sc, []reaper.StreamGroup{{Stream: env.Stream, Group: env.Group}}
			cfg.MinIdle, cfg.Namespace, cfg.OmitChargeMetadata = 200*time.Millisecond, teamsys.IdempotencyNamespace, true
			if stopped {
				cfg.StoppedConsumers = []string{"worker-live"}
			}
			team := env.Start(t, teamsys.Config{Role: teamsys.RoleConsumer, Consumer: "worker-live"})
			r := b.newReaper(t, cfg)
			if err := r.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = r.Stop(context.Background()) })
			testenv.Eventually(t, 60*time.Second, func() bool { return len(env.Rows(t)) == n }, "the team billed its %d customers", n)
			team.Stop()
			if err := r.Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
			k := b.kinds()
			if stopped {
				if k[reaper.KindClaim] == 0 {
					t.Fatalf("told the consumer is stopped, the reaper claimed nothing: %v", k)
				}
				return
			}
			if k[reaper.KindClaim] != 0 || k[reaper.KindRedriven] != 0 || k[reaper.KindUnregistered] == 0 {
				t.Fatalf("decisions %v: want unregistered_consumer and no claim", k)
			}
			for i := range n {
				if got := len(env.Charges(fmt.Sprintf("cus_%d", i), "2026-11")); got != 1 {
					t.Fatalf("cus_%d has %d charges, want 1", i, got)
				}
			}
			var named int
			for _, a := range b.notifier.Alerts() {
				if a.Kind == alerts.KindReaperAnomaly && a.Title == alerts.UnregisteredConsumers("", "", nil, 0).Title {
					named++
				}
			}
			if named != 1 {
				t.Fatalf("%d alerts naming the unregistered consumer, want exactly 1", named)
			}
		})
	}
}
