package consumer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/alerts/slacktest"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// slackPair is a real webhook notifier posting to the recording Slack, and
// the dead-letter aggregator over it, as the binaries wire them.
func slackPair(t *testing.T, b *bundle) (*slacktest.Recorder, *alerts.Slack, *alerts.DeadLetterAggregator) {
	t.Helper()
	rec := slacktest.NewRecorder()
	t.Cleanup(rec.Close)
	slack, err := alerts.NewSlackWebhook(alerts.Config{WebhookURL: rec.WebhookURL(), Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = slack.Close(context.Background()) })
	return rec, slack, alerts.NewDeadLetterAggregator(slack, time.Hour, b.clk)
}

// drained stops the aggregator (flushing it) and the notifier (draining its
// queue), and returns what Slack received.
func drained(t *testing.T, rec *slacktest.Recorder, slack *alerts.Slack, dl *alerts.DeadLetterAggregator) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := dl.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := slack.Close(ctx); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range rec.Messages() {
		got = append(got, m.Text)
	}
	return got
}

// TestSpendCapAlertedOnceInSlack: a meter event refused by its customer's
// cap reaches Slack once. The spend_cap alert used to be followed by the
// dead_letters alert counting the same event (spend_cap: 1): two messages
// for one event. Three refused events of one meter, customer and month,
// in two batches, are one message; a malformed event beside them still
// raises the dead_letters alert, counting only itself.
func TestSpendCapAlertedOnceInSlack(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	b := meterWorld(t, now)
	rec, slack, dl := slackPair(t, b)
	ledger, err := meterledger.New(b.pool, meterledger.Config{Schema: testenv.SchemaOf(b.pool)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := ledger.SetCap(ctx, meterledger.Cap{EventName: meterName, StripeCustomerID: "cus_0", Month: meterledger.AnyMonth, Cap: 1}); err != nil {
		t.Fatal(err)
	}
	c, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: b.rdb, DB: b.pool, Schema: testenv.SchemaOf(b.pool),
		Stripe: b.stripe, Stream: b.stream, Group: b.group, Name: "m-a", Namespace: "test", Block: 50 * time.Millisecond,
		Lease: 3 * time.Second, Notifier: slack, DeadLetters: dl, Logger: testenv.Logger(t), Clock: b.clk})
	if err != nil {
		t.Fatal(err)
	}
	// Values 2, 3, 4: each passes the cap of 1.
	b.addMeter(t, meterEvent(0, 1, now.Add(-time.Minute)), meterEvent(0, 2, now.Add(-time.Minute)))
	if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: map[string]any{"payload": `{"event_name":`}}).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := c.ProcessBatch(ctx, b.read(t, "m-a", 3)); err != nil || got.OverCap != 2 || got.DeadLetters != 3 {
		t.Fatalf("first batch %+v %v: want 2 over the cap, 3 dead letters", got, err)
	}
	b.addMeter(t, meterEvent(0, 3, now.Add(-time.Minute)))
	if got, err := c.ProcessBatch(ctx, b.read(t, "m-a", 1)); err != nil || got.OverCap != 1 {
		t.Fatalf("second batch %+v %v: want 1 over the cap", got, err)
	}
	if n := b.sim.MeterEventCounts().Recorded; n != 0 {
		t.Fatalf("Stripe counted %d meter events, want none", n)
	}
	got := drained(t, rec, slack, dl)
	if len(got) != 2 {
		t.Fatalf("Slack received %d messages, want 2 (one cap, one for the malformed event):\n%s", len(got), strings.Join(got, "\n---\n"))
	}
	caps, dead := 0, ""
	for _, m := range got {
		switch {
		case strings.HasPrefix(m, "Meter cap reached: "+meterName+" of cus_0"):
			caps++
		case strings.Contains(m, "dead-lettered on "+b.stream):
			dead = m
		}
	}
	if caps != 1 || !strings.HasPrefix(dead, "1 event dead-lettered") || strings.Contains(dead, consumer.ReasonSpendCap) {
		t.Fatalf("want one cap message and a dead_letters message of 1 event without spend_cap; got:\n%s", strings.Join(got, "\n---\n"))
	}
}

// TestBillingSpendCapAlertedOnceInSlack: the billing consumer's charge
// refused by the period's cap is one Slack message too, not a spend_cap
// alert and a dead_letters alert for the same event.
func TestBillingSpendCapAlertedOnceInSlack(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	rec, slack, dl := slackPair(t, b)
	ctx := context.Background()
	if _, err := b.ledger.SetCap(ctx, "2026-11", 1500); err != nil {
		t.Fatal(err)
	}
	evs := []event.Event{ev(1), ev(2)} // 1001 + 1002 cents: the second passes the cap
	b.add(t, evs...)
	cfg := b.config(t, "")
	cfg.Workers = 1
	cfg.Notifier, cfg.DeadLetters = slack, dl
	c := start(t, cfg)
	testenv.Eventually(t, 10*time.Second, func() bool { return len(deadLetters(t, b)) == 1 && b.pending(t) == 0 }, "second dead-lettered")
	if b.charges(evs[0]) != 1 || b.charges(evs[1]) != 0 {
		t.Fatalf("charges %d and %d: want the first only", b.charges(evs[0]), b.charges(evs[1]))
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	got := drained(t, rec, slack, dl)
	if len(got) != 1 || !strings.HasPrefix(got[0], "Spend cap reached for 2026-11") {
		t.Fatalf("Slack received %d messages, want the one spend_cap:\n%s", len(got), strings.Join(got, "\n---\n"))
	}
}

// TestMeterCapAlertedOnceAcrossTheFleet: two meter consumer processes (each
// its own Slack notifier, so its own dedupe) refuse events of one capped
// customer and month: Slack gets one cap message, not one per process (and
// per dedupe interval, all month). A raised cap reached again is told
// again, once.
func TestMeterCapAlertedOnceAcrossTheFleet(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	b := meterWorld(t, now)
	rec := slacktest.NewRecorder()
	t.Cleanup(rec.Close)
	ledger, err := meterledger.New(b.pool, meterledger.Config{Schema: testenv.SchemaOf(b.pool)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	month := now.Format("2006-01")
	var keys []string
	for _, capValue := range []int64{1, 3} {
		fp := alerts.MeterCapReached(meterName, "cus_0", month, capValue, 0, "", 0, "").Fingerprint
		keys = append(keys, consumer.CapAlertKey(testenv.SchemaOf(b.pool), "test", fp))
	}
	testenv.CleanupKeys(t, b.rdb, keys...)
	setCap := func(v int64) {
		if _, err := ledger.SetCap(ctx, meterledger.Cap{EventName: meterName, StripeCustomerID: "cus_0", Month: meterledger.AnyMonth, Cap: v}); err != nil {
			t.Fatal(err)
		}
	}
	process := func(name string) (*consumer.MeterConsumer, *alerts.Slack) {
		slack, err := alerts.NewSlackWebhook(alerts.Config{WebhookURL: rec.WebhookURL(), Logger: testenv.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = slack.Close(context.Background()) })
		c, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: b.rdb, DB: b.pool, Schema: testenv.SchemaOf(b.pool),
			Stripe: b.stripe, Stream: b.stream, Group: b.group, Name: name, Namespace: "test", Block: 50 * time.Millisecond,
			Lease: 3 * time.Second, Notifier: slack, Logger: testenv.Logger(t), Clock: b.clk})
		if err != nil {
			t.Fatal(err)
		}
		return c, slack
	}
	a, slackA := process("m-a")
	c2, slackB := process("m-b")
	refuse := func(c *consumer.MeterConsumer, name string, i int) {
		t.Helper()
		b.addMeter(t, meterEvent(0, i, now.Add(-time.Minute)))
		if got, err := c.ProcessBatch(ctx, b.read(t, name, 1)); err != nil || got.OverCap != 1 {
			t.Fatalf("%s: %+v %v: want the event over the cap", name, got, err)
		}
	}
	setCap(1)
	refuse(a, "m-a", 1)  // value 2
	refuse(c2, "m-b", 2) // value 3
	refuse(a, "m-a", 3)  // value 4
	setCap(3)
	refuse(a, "m-a", 8)  // value 4: the process that told of the cap of 1
	refuse(c2, "m-b", 9) // value 5
	for _, s := range []*alerts.Slack{slackA, slackB} {
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var caps []string
	for _, m := range rec.Messages() {
		caps = append(caps, m.Text)
	}
	if len(caps) != 2 || !strings.Contains(caps[0], "Cap: 1 units") || !strings.Contains(caps[1], "Cap: 3 units") {
		t.Fatalf("Slack received %d messages, want one for the cap of 1 and one for the cap of 3:\n%s", len(caps), strings.Join(caps, "\n---\n"))
	}
	if n := b.sim.MeterEventCounts().Recorded; n != 0 {
		t.Fatalf("Stripe counted %d meter events, want none", n)
	}
	// The fleet's memory of each alert expires (bounded.md).
	for _, k := range keys {
		if ttl, err := b.rdb.TTL(ctx, k).Result(); err != nil || ttl < consumer.CapAlertTTL-time.Minute || ttl > consumer.CapAlertTTL {
			t.Errorf("%s: TTL %s %v, want %s", k, ttl, err, consumer.CapAlertTTL)
		}
	}
}
