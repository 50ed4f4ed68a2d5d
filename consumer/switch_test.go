package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/testkit/teamsys"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

// teamNamespace is the article's key suffix: pelguard run with it computes
// the team's own idempotency keys.
const teamNamespace = teamsys.IdempotencyNamespace

// teamCharge charges e the way the article's consumer does: Charges API,
// the content-hash key, the seed's description, no metadata.
func (b *bundle) teamCharge(t *testing.T, e event.Event) stripeapi.Charge {
	t.Helper()
	sc := b.chargesClient(t)
	ch, err := sc.Charge(context.Background(), stripeapi.ChargeRequest{
		IdempotencyKey: e.Key(teamNamespace), StripeCustomerID: e.StripeCustomerID,
		AmountCents: e.AmountCents, Currency: e.Currency, Description: "Usage billing for " + e.BillingPeriod,
	})
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func (b *bundle) chargesClient(t *testing.T) *stripeapi.Client {
	t.Helper()
	sc, err := stripeapi.New(stripeapi.Config{APIKey: testKey, BaseURL: b.sim.URL(), Mode: stripeapi.ModeCharges, MaxNetworkRetries: stripeapi.NoRetries})
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// allCharges counts succeeded, unrefunded charges of e's Stripe customer
// for its period, marked or not: what the customer actually paid.
func (b *bundle) allCharges(e event.Event) int {
	return len(teamsys.Charges(b.sim, e.StripeCustomerID, e.BillingPeriod))
}

// Switching a team: the team's consumer charged these customers but never
// acked (killed before XACK), and pelguard takes over the stream. Each way
// pelguard can meet the team's charge ends with that charge recorded, no
// second charge and no alert saying the customer was not billed.
func TestSwitchingFindsTheTeamsCharges(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// cfg adjusts the consumer; before runs after the team's charge.
		cfg    func(*consumer.Config, *testing.T, *bundle)
		before func(*testing.T, *bundle)
	}{
		{
			// Same key and request shape within 24 h: Stripe itself
			// returns the team's charge.
			name: "same key and request shape",
			cfg: func(c *consumer.Config, t *testing.T, b *bundle) {
				c.Stripe, c.OmitChargeMetadata = b.chargesClient(t), true
			},
		},
		{
			// Same key, pelguard's metadata: Stripe answers
			// idempotency_error, and the look-up finds the unmarked charge.
			name: "same key with pelguard's metadata",
			cfg:  func(c *consumer.Config, t *testing.T, b *bundle) { c.Stripe = b.chargesClient(t) },
		},
		{
			// 25 h later Stripe has forgotten the key: only the look-up of a
			// period with imported history stands between the customer and
			// a second charge.
			name: "key forgotten, period imported",
			cfg: func(c *consumer.Config, t *testing.T, b *bundle) {
				c.Stripe, c.OmitChargeMetadata = b.chargesClient(t), true
			},
			before: func(t *testing.T, b *bundle) {
				b.sim.Advance(25 * time.Hour)
				if _, err := b.pool.Exec(context.Background(), `INSERT INTO imported_periods (billing_period) VALUES ('2026-11')`); err != nil {
					t.Fatal(err)
				}
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, opts{})
			e := ev(1)
			team := b.teamCharge(t, e)
			if c.before != nil {
				c.before(t, b)
			}
			b.add(t, e)
			mem := alerts.NewMemory()
			cfg := b.config(t, "")
			cfg.Namespace, cfg.Notifier = teamNamespace, mem
			c.cfg(&cfg, t, b)
			start(t, cfg)
			testenv.Eventually(t, 20*time.Second, func() bool {
				return b.status(e) == ledger.StatusCharged && b.pending(t) == 0
			}, "the event recorded charged and acked")
			if got := b.record(t, e).ChargeID; got != team.ID {
				t.Fatalf("ledger records %s, want the team's charge %s", got, team.ID)
			}
			if n := b.allCharges(e); n != 1 {
				t.Fatalf("%d charges for the customer, want 1 (the team's)", n)
			}
			for _, a := range mem.Alerts() {
				if a.Kind == alerts.KindChargeFailed {
					t.Fatalf("false %q alert: %+v", a.Kind, a)
				}
			}
		})
	}
}

// Control: without the imported period, a key Stripe has forgotten and a
// row of pelguard's own making do not ask Stripe, and the customer is
// charged twice. This is what `consumer import` exists to prevent.
func TestSwitchingWithoutImportChargesTwice(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	e := ev(2)
	b.teamCharge(t, e)
	b.sim.Advance(25 * time.Hour)
	b.add(t, e)
	cfg := b.config(t, "")
	cfg.Namespace, cfg.Stripe, cfg.OmitChargeMetadata = teamNamespace, b.chargesClient(t), true
	start(t, cfg)
	testenv.Eventually(t, 20*time.Second, func() bool { return b.status(e) == ledger.StatusCharged }, "charged")
	if n := b.allCharges(e); n != 2 {
		t.Fatalf("%d charges; the control expects the double charge (2)", n)
	}
}

// A pelguard consumer registers its name and heartbeat time where the
// reaper looks, as soon as it starts and on every heartbeat.
func TestConsumerRegistersLiveness(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	testenv.CleanupKeys(t, b.rdb, consumer.LivenessKey(b.stream, b.group))
	cfg := b.config(t, "registered-consumer")
	start(t, cfg)
	var first time.Time
	testenv.Eventually(t, 10*time.Second, func() bool {
		reg, err := consumer.Registered(context.Background(), b.rdb, b.stream, b.group)
		first = reg["registered-consumer"]
		return err == nil && !first.IsZero()
	}, "the consumer registered")
	testenv.Eventually(t, 10*time.Second, func() bool {
		reg, _ := consumer.Registered(context.Background(), b.rdb, b.stream, b.group)
		return reg["registered-consumer"].After(first)
	}, "the heartbeat refreshed the registration")
}

// B2B: one Stripe customer pays for c_b1 and c_b2, the same amount. The
// team charged c_b1 (imported: the ledger records it); c_b2's look-up
// matches that same unmarked charge. pelguard neither records another
// customer's charge for c_b2 nor charges it blind: it stays pending and
// the alert says why.
func TestLookupNeverTakesAnotherKeysCharge(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	e1, e2 := ev(31), ev(32)
	e2.StripeCustomerID, e2.AmountCents = e1.StripeCustomerID, e1.AmountCents
	team := b.teamCharge(t, e1)
	b.sim.Advance(25 * time.Hour)
	ctx := context.Background()
	if _, err := b.ledger.SeedForTest(ctx, []ledger.Record{{Key: ledger.EventKey(e1), StripeCustomerID: e1.StripeCustomerID,
		AmountCents: e1.AmountCents, IdempotencyKey: e1.Key(teamNamespace), ChargeID: team.ID}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO imported_periods (billing_period) VALUES ('2026-11')`); err != nil {
		t.Fatal(err)
	}
	b.add(t, e2)
	mem := alerts.NewMemory()
	cfg := b.config(t, "")
	cfg.Namespace, cfg.Notifier, cfg.Stripe, cfg.OmitChargeMetadata = teamNamespace, mem, b.chargesClient(t), true
	start(t, cfg)
	testenv.Eventually(t, 20*time.Second, func() bool {
		for _, a := range mem.Alerts() {
			if a.Kind == alerts.KindStripeLookupFailed {
				return true
			}
		}
		return false
	}, "an alert that c_b2's charge cannot be told")
	if got := b.status(e2); got != ledger.StatusPending {
		t.Fatalf("c_b2 is %q, want pending", got)
	}
	if n := b.allCharges(e1); n != 1 {
		t.Fatalf("%d charges for the shared Stripe customer, want 1 (nothing charged blind)", n)
	}
}
