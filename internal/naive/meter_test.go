package naive_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/naive"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

// The same usage event delivered three times (as a rollback or a reclaim
// delivers it again): twice at once, then once more 25 h later. Without an
// identifier Stripe counts every delivery; with the event's id as the
// identifier it refuses the repeat within its window (the consumer acks
// it), and counts it again once the window has passed.
func TestMeterRedeliveryCounts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		identifier bool
		want       []int64 // Stripe's total after each delivery
	}{
		{false, []int64{7, 14, 21}},
		{true, []int64{7, 7, 14}},
	} {
		b := setup(t, stripesim.Faults{})
		if _, err := b.sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: "api_requests"}); err != nil {
			t.Fatal(err)
		}
		sc, err := stripeapi.New(stripeapi.Config{APIKey: "sk_test_naive", BaseURL: b.sim.URL(), MaxNetworkRetries: -1, Logger: testenv.Discard()})
		if err != nil {
			t.Fatal(err)
		}
		c, err := naive.NewMeterConsumer(naive.MeterConsumerConfig{Redis: b.rdb, Stream: b.stream, Group: b.group,
			Name: "worker-1", Block: 100 * time.Millisecond, Stripe: sc, Identifier: tc.identifier, Logger: testenv.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		ev := event.MeterEvent{EventName: "api_requests", StripeCustomerID: "cus_7", Value: 7,
			Timestamp: b.sim.Now().Add(-time.Hour).Truncate(time.Second), EventID: "req-7"}
		for i, want := range tc.want {
			if i == 2 {
				b.sim.Advance(25 * time.Hour)
			}
			if err := b.rdb.XAdd(t.Context(), &redis.XAddArgs{Stream: b.stream, Values: map[string]any{naive.PayloadField: ev.Payload()}}).Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := c.RunOnce(t.Context()); err != nil {
				t.Fatalf("identifier %v, delivery %d: %v", tc.identifier, i+1, err)
			}
			if got := b.sim.MeterTotal("api_requests", "cus_7"); got != want {
				t.Errorf("identifier %v: after delivery %d Stripe counts %d, want %d", tc.identifier, i+1, got, want)
			}
		}
		if p, _ := b.rdb.XPending(t.Context(), b.stream, b.group).Result(); p.Count != 0 {
			t.Errorf("identifier %v: %d pending: a refused repeat must be acked", tc.identifier, p.Count)
		}
	}
}
