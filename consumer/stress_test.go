package consumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/reaper"
)

// Two consumers × 8 workers over 5,000 events, random Stripe latency and 5 %
// transient faults (500s, and charges committed whose reply is lost), with
// the reaper re-driving what the faults left pending: exactly 5,000 charges,
// no duplicate, every ledger row terminal, the PEL empty.
func TestManyEventsWithFaults(t *testing.T) {
	t.Parallel()
	const n = 5000
	b := setup(t, opts{})
	if err := b.sim.SetFaults(stripesim.Faults{
		Latency:   stripesim.Latency{Min: 0, Max: 10 * time.Millisecond},
		ErrorRate: 0.04,
		DropRate:  0.01,
	}); err != nil {
		t.Fatal(err)
	}
	evs := make([]event.Event, n)
	for i := range n {
		evs[i] = ev(i)
	}
	w := b
	w.seed(t, n)
	for i := range 2 {
		cfg := b.config(t, fmt.Sprintf("consumer-%d", i))
		cfg.Workers = 8
		cfg.Count = 50
		cfg.Lease = 2 * time.Second
		cfg.Logger = testenv.Discard()
		start(t, cfg)
	}
	r, err := reaper.New(reaper.Config{
		Redis: b.rdb, DB: b.pool, Schema: testenv.SchemaOf(b.pool), Clock: b.clk, Stripe: b.stripe,
		Streams: []reaper.StreamGroup{{Stream: b.stream, Group: b.group}},
		Name:    "reaper", Namespace: "test", MinIdle: time.Second, Interval: 200 * time.Millisecond,
		Lease: 2 * time.Second, Logger: testenv.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(context.Background()) })

	testenv.Eventually(t, 3*time.Minute, func() bool {
		c, err := b.ledger.Counts(context.Background())
		return err == nil && c[ledger.StatusCharged] == n && b.pending(t) == 0
	}, "%d charged and the PEL empty", n)

	if d := b.sim.Duplicates(); len(d) != 0 {
		t.Fatalf("%d duplicate groups at Stripe, e.g. %+v", len(d), d[0])
	}
	charged := 0
	for _, c := range b.sim.Charges() {
		if c.Status == "succeeded" {
			charged++
		}
	}
	if charged != n {
		t.Fatalf("%d succeeded charges at Stripe, want %d", charged, n)
	}
	counts, _ := b.ledger.Counts(context.Background())
	if counts[ledger.StatusPending] != 0 || counts[ledger.StatusCharged] != n {
		t.Fatalf("ledger %v", counts)
	}
	if dl := deadLetters(t, b); len(dl) != 0 {
		t.Fatalf("%d dead letters, e.g. %v", len(dl), dl[0].Values)
	}
	t.Logf("stripe requests: %v", b.sim.Requests())
	_ = consumer.OutcomeCharged
}
