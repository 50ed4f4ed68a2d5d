package consumer_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

// TestMeterDeadLettersAlert: usage events refused by Stripe (no such
// meter) and a malformed one are dead-lettered and, like the billing
// consumer's, raise one dead_letters alert for the stream naming both
// reasons and the customer, with the replay command for that stream. The
// first refusal is announced by the meter_missing alert and is not counted
// again in the dead_letters alert: one event, one message.
func TestMeterDeadLettersAlert(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	b := setup(t, opts{simNow: now}) // no meter at the emulator
	mem := alerts.NewMemory()
	dl := alerts.NewDeadLetterAggregator(mem, time.Hour, b.clk)
	t.Cleanup(func() { _ = dl.Stop(context.Background()) })
	c, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: b.rdb, DB: b.pool, Schema: testenv.SchemaOf(b.pool),
		Stripe: b.stripe, Stream: b.stream, Group: b.group, Name: "m-a", Namespace: "test", Block: 50 * time.Millisecond,
		Lease: 3 * time.Second, DeadLetters: dl, Notifier: mem, Logger: testenv.Logger(t), Clock: b.clk})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	b.addMeter(t, meterEvent(8, 8, now.Add(-time.Minute)), meterEvent(7, 7, now.Add(-time.Minute)))
	if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: map[string]any{"payload": `{"event_name":`}}).Err(); err != nil {
		t.Fatal(err)
	}
	got, err := c.ProcessBatch(ctx, b.read(t, "m-a", 3))
	if err != nil || got.DeadLetters != 3 {
		t.Fatalf("batch %+v %v: want three dead letters", got, err)
	}
	if n := dl.Flush(); n != 1 {
		t.Fatalf("flushed %d alerts, want one for the stream", n)
	}
	as := mem.Alerts()
	if len(as) != 2 || as[0].Kind != alerts.KindMeterMissing || as[1].Kind != alerts.KindDeadLetters {
		t.Fatalf("alerts %+v: want meter_missing, then one dead_letters", as)
	}
	a := as[1]
	if !strings.Contains(a.Title, "2 events dead-lettered on "+b.stream) {
		t.Errorf("title %q", a.Title)
	}
	reasons := map[string]bool{}
	for _, f := range a.Fields {
		reasons[f.Label] = true
	}
	if !reasons[consumer.ReasonMeterRefused] || len(reasons) != 2 {
		t.Errorf("fields %+v: want %s and the malformed event's reason", a.Fields, consumer.ReasonMeterRefused)
	}
	if !strings.Contains(a.Items[0].Text+a.Items[1].Text, "c_7") {
		t.Errorf("examples %+v: want the customer c_7", a.Items)
	}
	if !strings.Contains(a.Text, "pelguard-consumer replay --stream "+b.stream) {
		t.Errorf("text %q: want the replay command for %s", a.Text, b.stream)
	}
}

// TestMeterMissingSaysSoOnce: events for a meter Stripe does not have are
// refused; the first refusal says so once (one meter_missing alert, one
// error log line) with the event name, how to create the meter and how to
// replay, however many events follow; a refusal of another kind does not.
// The Stripe client logs into the same logger at the binaries' default
// level (info), as they build it: stripe-go's own line per refused request
// ("Request error from Stripe (status 400) …", a warning each) is not in
// it, so the one line above is all the log says of the missing meter.
func TestMeterMissingSaysSoOnce(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	b := setup(t, opts{simNow: now}) // no meter at the emulator
	mem := alerts.NewMemory()
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	sc, err := stripeapi.New(stripeapi.Config{APIKey: testKey, BaseURL: b.sim.URL(), MaxNetworkRetries: -1, Timeout: 10 * time.Second, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	c, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: b.rdb, DB: b.pool, Schema: testenv.SchemaOf(b.pool),
		Stripe: sc, Stream: b.stream, Group: b.group, Name: "m-a", Namespace: "test", Block: 50 * time.Millisecond,
		Lease: 3 * time.Second, Notifier: mem, Logger: logger, Clock: b.clk})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for batch := 0; batch < 2; batch++ {
		b.addMeter(t, meterEvent(1, batch, now.Add(-time.Minute)), meterEvent(2, batch, now.Add(-time.Minute)))
		got, err := c.ProcessBatch(ctx, b.read(t, "m-a", 2))
		if err != nil || got.DeadLetters != 2 {
			t.Fatalf("batch %d: %+v %v: want two dead letters", batch, got, err)
		}
	}
	var missing []alerts.Alert
	for _, a := range mem.Alerts() {
		if a.Kind == alerts.KindMeterMissing {
			missing = append(missing, a)
		}
	}
	if len(missing) != 1 {
		t.Fatalf("%d meter_missing alerts for 4 refused events, want 1: %+v", len(missing), mem.Alerts())
	}
	for _, want := range []string{meterName, "/v1/billing/meters", "event_name=" + meterName,
		"pelguard-consumer replay --stream " + b.stream + " --reason meter_event_refused"} {
		if !strings.Contains(missing[0].Text, want) {
			t.Errorf("alert text lacks %q:\n%s", want, missing[0].Text)
		}
	}
	if n := strings.Count(logs.String(), "no Stripe meter for this event name"); n != 1 {
		t.Errorf("%d log lines about the missing meter, want 1:\n%s", n, logs.String())
	}
	for line := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(line, "stripe-go") || strings.Contains(line, "Request error from Stripe") {
			t.Errorf("stripe-go's own line reaches the log:\n%s", line)
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
