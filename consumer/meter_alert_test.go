package consumer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// TestMeterDeadLettersAlert: a usage event refused by Stripe (no such
// meter) and a malformed one are dead-lettered and, like the billing
// consumer's, raise one dead_letters alert for the stream naming both
// reasons and the customer, with the replay command for that stream.
func TestMeterDeadLettersAlert(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	b := setup(t, opts{simNow: now}) // no meter at the emulator
	mem := alerts.NewMemory()
	dl := alerts.NewDeadLetterAggregator(mem, time.Hour, b.clk)
	t.Cleanup(func() { _ = dl.Stop(context.Background()) })
	c, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: b.rdb, DB: b.pool, Schema: testenv.SchemaOf(b.pool),
		Stripe: b.stripe, Stream: b.stream, Group: b.group, Name: "m-a", Namespace: "test", Block: 50 * time.Millisecond,
		Lease: 3 * time.Second, DeadLetters: dl, Logger: testenv.Logger(t), Clock: b.clk})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	b.addMeter(t, meterEvent(7, 7, now.Add(-time.Minute)))
	if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: map[string]any{"payload": `{"event_name":`}}).Err(); err != nil {
		t.Fatal(err)
	}
	got, err := c.ProcessBatch(ctx, b.read(t, "m-a", 2))
	if err != nil || got.DeadLetters != 2 {
		t.Fatalf("batch %+v %v: want two dead letters", got, err)
	}
	if n := dl.Flush(); n != 1 {
		t.Fatalf("flushed %d alerts, want one for the stream", n)
	}
	as := mem.Alerts()
	if len(as) != 1 || as[0].Kind != alerts.KindDeadLetters {
		t.Fatalf("alerts %+v: want one dead_letters", as)
	}
	a := as[0]
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
