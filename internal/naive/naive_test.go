package naive_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/internal/naive"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

type bundle struct {
	rdb    *redis.Client
	stream string
	group  string
	sim    *stripesim.Server
}

func setup(t *testing.T, faults stripesim.Faults) *bundle {
	t.Helper()
	b := &bundle{
		rdb:    testenv.Redis(t),
		stream: testenv.Name(t, "naive-stream"),
		group:  testenv.Name(t, "naive-group"),
		sim:    stripesim.MustNew(stripesim.Config{Faults: faults}),
	}
	t.Cleanup(b.sim.Close)
	testenv.CleanupKeys(t, b.rdb, b.stream)
	if err := naive.CreateGroup(t.Context(), b.rdb, b.stream, b.group); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *bundle) stripe(t *testing.T, hc *http.Client) *stripeapi.Client {
	t.Helper()
	c, err := stripeapi.New(stripeapi.Config{
		APIKey: "sk_test_naive", BaseURL: b.sim.URL(), Mode: stripeapi.ModeCharges,
		HTTPClient: hc, Logger: testenv.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (b *bundle) consumer(t *testing.T, name string, count int64, deferAck bool, sc *stripeapi.Client) *naive.Consumer {
	t.Helper()
	c, err := naive.NewConsumer(naive.ConsumerConfig{
		Redis: b.rdb, Stream: b.stream, Group: b.group, Name: name, Count: count,
		Block: 100 * time.Millisecond, Stripe: sc, DeferAck: deferAck, Logger: testenv.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (b *bundle) publish(t *testing.T, customers ...int) {
	t.Helper()
	for _, i := range customers {
		payload, _ := json.Marshal(naive.Event{
			CustomerID: fmt.Sprintf("c_%d", i), StripeCustomerID: fmt.Sprintf("cus_%d", i),
			AmountCents: 2500, BillingPeriod: "2026-11", Currency: "usd",
		})
		if err := b.rdb.XAdd(t.Context(), &redis.XAddArgs{Stream: b.stream, Values: map[string]any{naive.PayloadField: payload}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// waitIdle waits until n pending entries have been idle for at least idle.
func (b *bundle) waitIdle(t *testing.T, n int, idle time.Duration) {
	t.Helper()
	testenv.Eventually(t, 3*time.Second, func() bool {
		p, err := b.rdb.XPendingExt(t.Context(), &redis.XPendingExtArgs{
			Stream: b.stream, Group: b.group, Start: "-", End: "+", Count: int64(n), Idle: idle,
		}).Result()
		return err == nil && len(p) == n
	}, "%d entries never became idle for %s", n, idle)
}

// duplicates maps Stripe customer → number of succeeded charges, for those
// charged more than once (the emulator reads the period from the naive
// description, since naive charges carry no metadata).
func (b *bundle) duplicates() map[string]int {
	out := map[string]int{}
	for _, g := range b.sim.Duplicates() {
		out[g.Customer] = len(g.ChargeIDs)
	}
	return out
}

// TestReclaimWhileInFlight reproduces failure mode 1: the monitor's
// XAUTOCLAIM (min-idle 100 ms) takes the entry while consumer A's 400 ms
// Stripe call is still running, and consumer B charges the customer again.
func TestReclaimWhileInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Faults{Latency: stripesim.Latency{Fixed: 400 * time.Millisecond}})
	sc := b.stripe(t, nil)
	consumerA := b.consumer(t, "worker-1", 1, false, sc)
	consumerB := b.consumer(t, "consumer-B", 1, false, sc)
	monitor, err := naive.NewMonitor(naive.MonitorConfig{
		Redis: b.rdb, Stream: b.stream, Group: b.group, Consumer: "consumer-B",
		MinIdle: 100 * time.Millisecond, Handler: consumerB.ProcessClaimed, Logger: testenv.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	b.publish(t, 42)

	doneA := make(chan error, 1)
	go func() {
		n, err := consumerA.RunOnce(t.Context())
		if err == nil && n != 1 {
			err = fmt.Errorf("consumer A processed %d", n)
		}
		doneA <- err
	}()
	// A is alive, just slow: its entry is idle past min-idle while its
	// Stripe call is in flight.
	b.waitIdle(t, 1, 100*time.Millisecond)
	claimed, err := monitor.RunOnce(t.Context())
	if err != nil || claimed != 1 {
		t.Fatalf("monitor claimed %d, err %v", claimed, err)
	}
	if err := <-doneA; err != nil {
		t.Fatal(err)
	}

	if got := b.duplicates(); got["cus_42"] != 2 || len(got) != 1 {
		t.Fatalf("want cus_42 charged twice, got %v", got)
	}
	// And the stream looks perfectly healthy: nothing pending.
	if p, _ := b.rdb.XPending(t.Context(), b.stream, b.group).Result(); p.Count != 0 {
		t.Fatalf("pending = %d, want 0", p.Count)
	}
}

// failNth makes the emulator answer the nth charge POST with a 500 (its
// ErrorRate knob, on for that one request only), standing in for the seed's
// timeout on customer 7.
type failNth struct {
	sim   *stripesim.Server
	n     int64
	calls atomic.Int64
	next  http.RoundTripper
}

func (f *failNth) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPost && f.calls.Add(1) == f.n {
		if err := f.sim.SetFaults(stripesim.Faults{ErrorRate: 1}); err != nil {
			return nil, err
		}
		defer func() { _ = f.sim.SetFaults(stripesim.Faults{}) }()
	}
	return f.next.RoundTrip(r)
}

// TestPartialBatch reproduces failure mode 2: XREADGROUP COUNT 10 with
// deferred XACK, the 7th charge fails, nothing is acked, the monitor
// reclaims all ten and customers 1–6 are charged twice.
func TestPartialBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Faults{})
	faulty := b.stripe(t, &http.Client{Transport: &failNth{sim: b.sim, n: 7, next: http.DefaultTransport}})
	consumerA := b.consumer(t, "worker-1", 10, true, faulty)
	consumerB := b.consumer(t, "consumer-B", 10, false, b.stripe(t, nil))
	monitor, err := naive.NewMonitor(naive.MonitorConfig{
		Redis: b.rdb, Stream: b.stream, Group: b.group, Consumer: "consumer-B",
		MinIdle: 100 * time.Millisecond, Handler: consumerB.ProcessClaimed,
	})
	if err != nil {
		t.Fatal(err)
	}
	b.publish(t, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)

	n, err := consumerA.RunOnce(t.Context())
	if !errors.Is(err, stripeapi.ErrTransient) || n != 6 {
		t.Fatalf("want 6 charged then a transient error, got %d, %v", n, err)
	}
	if p, _ := b.rdb.XPending(t.Context(), b.stream, b.group).Result(); p.Count != 10 {
		t.Fatalf("pending = %d, want the whole batch (10)", p.Count)
	}
	// Redis idle time is wall-clock: wait until the whole batch is past min-idle.
	b.waitIdle(t, 10, 100*time.Millisecond)
	claimed, err := monitor.RunOnce(t.Context())
	if err != nil || claimed != 10 {
		t.Fatalf("monitor claimed %d, err %v", claimed, err)
	}

	got := b.duplicates()
	for i := 1; i <= 6; i++ {
		if got[fmt.Sprintf("cus_%d", i)] != 2 {
			t.Errorf("cus_%d: %d charges, want 2", i, got[fmt.Sprintf("cus_%d", i)])
		}
	}
	if len(got) != 6 {
		t.Errorf("duplicates = %v, want exactly customers 1-6", got)
	}
	if total := len(b.sim.Charges()); total != 16 {
		t.Errorf("stored charges = %d, want 16 (10 + 6 duplicates)", total)
	}
}

// TestRecordBeforeAckNoPreflight shows failure mode 3's shape: the record
// hook runs after the charge while the entry is still pending, and a
// redelivery (here: the same payload published again, as an AOF rollback
// would restore it) is charged again because nothing reads the record first.
func TestRecordBeforeAckNoPreflight(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Faults{})
	var recorded atomic.Int64
	c, err := naive.NewConsumer(naive.ConsumerConfig{
		Redis: b.rdb, Stream: b.stream, Group: b.group, Name: "worker-1", Block: 100 * time.Millisecond,
		Stripe: b.stripe(t, nil),
		Record: func(ctx context.Context, msgID string, ev naive.Event, ch stripeapi.Charge) error {
			p, err := b.rdb.XPending(ctx, b.stream, b.group).Result()
			if err != nil || p.Count != 1 {
				return fmt.Errorf("record ran with %d pending (err %v), want 1: XACK must come after", p.Count, err)
			}
			if ch.ID == "" || ev.CustomerID != "c_7" {
				return fmt.Errorf("record got %+v %+v", ev, ch)
			}
			recorded.Add(1)
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		b.publish(t, 7)
		if n, err := c.RunOnce(t.Context()); err != nil || n != 1 {
			t.Fatalf("RunOnce = %d, %v", n, err)
		}
	}
	if recorded.Load() != 2 {
		t.Fatalf("recorded %d times, want 2", recorded.Load())
	}
	if got := b.duplicates(); got["cus_7"] != 2 {
		t.Fatalf("want cus_7 charged twice, got %v", got)
	}
}
