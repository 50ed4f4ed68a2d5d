package consumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/alerts/slacktest"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// A Slack that hangs never blocks billing: with every Slack request hanging,
// a consumer whose events raise alerts (declines, dead letters, permanent
// failures) still handles every event, charges every good one once, and the
// alerts that could not be sent are counted as dropped or failed, not waited on.
func TestHangingSlackNeverBlocksBilling(t *testing.T) {
	t.Parallel()
	rec := slacktest.NewRecorder()
	rec.HangAll()
	t.Cleanup(rec.Close)
	slack, err := alerts.NewSlackWebhook(alerts.Config{WebhookURL: rec.WebhookURL(), QueueSize: 4,
		RequestTimeout: time.Hour, Logger: testenv.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_ = slack.Close(ctx)
	})
	// Fill the queue behind a hung request before billing starts: every
	// alert the consumer raises from here on meets a full queue.
	for i := range 100 {
		slack.Notify(alerts.ChargeFailed(fmt.Sprintf("filler_%d", i), "2026-11", "queue filler"))
	}
	dl := alerts.NewDeadLetterAggregator(slack, 10*time.Millisecond, nil)
	t.Cleanup(func() { _ = dl.Stop(context.Background()) })

	b := setup(t, opts{})
	const good, bad, declined = 200, 100, 50
	var goods []event.Event
	var declinedCust []string
	for i := range good + declined {
		e := ev(i)
		if i >= good {
			declinedCust = append(declinedCust, e.StripeCustomerID)
		}
		goods = append(goods, e)
	}
	_ = b.sim.SetFaults(stripesim.Faults{DeclineCustomers: declinedCust})
	b.add(t, goods...)
	for i := range bad {
		b.addRaw(t, map[string]any{"payload": fmt.Sprintf(`{"customer_id":"bad_%d"}`, i)})
	}
	cfg := b.config(t, "")
	cfg.Workers = 8
	cfg.Count = 50
	cfg.Notifier = slack
	cfg.DeadLetters = dl
	cfg.Logger = testenv.Discard()
	start(t, cfg)
	testenv.Eventually(t, 60*time.Second, func() bool {
		c, err := b.ledger.Counts(context.Background())
		return err == nil && c[ledger.StatusCharged] == good && c[ledger.StatusDeclined] == declined &&
			len(deadLetters(t, b)) == bad && b.pending(t) == 0
	}, "every event handled while Slack hangs")
	for _, e := range goods[:good] {
		if n := b.charges(e); n != 1 {
			t.Fatalf("%s: %d charges", e.CustomerID, n)
		}
	}
	if len(rec.Requests()) == 0 {
		t.Fatal("no alert ever reached the hanging Slack: the test did not exercise it")
	}
	st := slack.Stats()
	if st.Sent != 0 {
		t.Fatalf("a hanging Slack cannot have accepted %d alerts", st.Sent)
	}
	if st.Dropped < 95 {
		t.Fatalf("alerts beyond the queue must be dropped and counted: %+v", st)
	}
}
