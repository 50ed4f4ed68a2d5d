package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

func TestChargesEachEventOnceAndAcks(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	var evs []event.Event
	for i := range 25 {
		evs = append(evs, ev(i))
	}
	b.add(t, evs...)
	cfg := b.config(t, "")
	cfg.Count = 10
	start(t, cfg)
	testenv.Eventually(t, 20*time.Second, func() bool {
		n, _ := b.ledger.Counts(context.Background())
		return n[ledger.StatusCharged] == 25 && b.pending(t) == 0
	}, "25 events charged and acked")
	for _, e := range evs {
		if n := b.charges(e); n != 1 {
			t.Errorf("%s: %d charges", e.CustomerID, n)
		}
		r := b.record(t, e)
		ch, ok := b.sim.Charge(r.ChargeID)
		if !ok || ch.Metadata["idempotency_key"] != e.Key("test") || ch.Metadata["pelguard"] != "1" || ch.Amount != e.AmountCents {
			t.Errorf("%s: charge %s lacks pelguard metadata or amount: %+v", e.CustomerID, r.ChargeID, ch)
		}
	}
	// The same events again (a producer retry, an AOF replay): nothing new.
	b.add(t, evs...)
	testenv.Eventually(t, 10*time.Second, func() bool { return b.pending(t) == 0 }, "replayed events acked")
	if got := b.sim.ChargeCreates(); got != 25 {
		t.Fatalf("replayed events made %d charge creates, want 25", got)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	for name, mut := range map[string]func(*consumer.Config){
		"no stream":   func(c *consumer.Config) { c.Stream = "" },
		"zero count":  func(c *consumer.Config) { c.Count = -1 },
		"short lease": func(c *consumer.Config) { c.Lease = time.Millisecond },
		"window":      func(c *consumer.Config) { c.SafeKeyWindow = 25 * time.Hour },
	} {
		cfg := b.config(t, "")
		mut(&cfg)
		if _, err := consumer.New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	c1, _ := consumer.New(b.config(t, ""))
	c2, _ := consumer.New(b.config(t, ""))
	if c1.Name() == c2.Name() {
		t.Fatal("default consumer names must be unique per instance")
	}
	// Stop before Start and twice is safe.
	if err := c1.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := c1.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}
