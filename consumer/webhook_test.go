package consumer_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

const testWebhookSecret = "whsec_pelguard_consumer_test"

// hooked is a motion world whose emulator holds its signed events for the
// test to deliver, in the order it wants, to a real HTTP server running
// the webhook handler.
type hooked struct {
	*motion
	srv     *httptest.Server
	metrics *consumer.WebhookMetrics
}

// setupHooked's webhook runs with policy, or the policy the consumer
// tests use (3 retries an hour apart) when none is given.
func setupHooked(t *testing.T, faults stripesim.Faults, policy ...consumer.RetryPolicy) *hooked {
	t.Helper()
	pol := consumer.RetryPolicy{Retries: 3, After: time.Hour}
	if len(policy) > 0 {
		pol = policy[0]
	}
	var handler atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handler.Load().(http.Handler).ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	m := setupMotionWebhook(t, stripesim.Webhook{URL: srv.URL + consumer.WebhookPath, Secret: testWebhookSecret, Hold: true}, faults, nil)
	metrics := consumer.NewWebhookMetrics(prometheus.NewRegistry())
	h, err := consumer.WebhookHandler(consumer.WebhookConfig{DB: m.pool, Schema: testenv.SchemaOf(m.pool), Secret: testWebhookSecret,
		Retry: pol, Notifier: m.alerts, Logger: testenv.Logger(t), Clock: m.clk, Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	handler.Store(h)
	return &hooked{motion: m, srv: srv, metrics: metrics}
}

// deliver sends the held events of types (in that order) about objects of
// e's Stripe customer and returns the receiver's statuses.
func (h *hooked) deliver(t *testing.T, ids ...string) []int {
	t.Helper()
	ds, err := h.sim.DeliverEvents(context.Background(), ids...)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]int, len(ds))
	for i, d := range ds {
		out[i] = d.Status
	}
	return out
}

// eventIDs are the recorded events of the given types, oldest first.
func (h *hooked) eventIDs(types ...string) []string {
	var out []string
	for _, ev := range h.sim.Events() {
		for _, typ := range types {
			if ev.Type == typ {
				out = append(out, ev.ID)
			}
		}
	}
	return out
}

func (h *hooked) results(result string) float64 {
	return consumer.WebhookResults(h.metrics, result)
}

// A settled debit's events settle the row at once; the same event again
// changes nothing; a bad signature is refused with 400 and changes
// nothing.
func TestWebhookSettlesAndIsIdempotent(t *testing.T) {
	t.Parallel()
	e := ev(1)
	h := setupHooked(t, stripesim.Faults{DebitCustomers: []string{e.StripeCustomerID}})
	h.add(t, e)
	if out := h.motion.deliver(t); out != consumer.OutcomeProcessing {
		t.Fatalf("outcome %s", out)
	}
	rec := h.record(t, e)
	if err := h.sim.Settle(rec.ChargeID, true, ""); err != nil {
		t.Fatal(err)
	}
	succeeded := h.eventIDs("charge.succeeded")
	if len(succeeded) != 1 {
		t.Fatalf("events %v", h.sim.Events())
	}

	// Forged: the right payload signed with another secret.
	payload := h.sim.Events()[len(h.sim.Events())-1].Payload
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+consumer.WebhookPath, bytes.NewReader(payload))
	req.Header.Set("Stripe-Signature", stripesim.SignPayload(payload, "whsec_someone_else", time.Now()))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || h.status(e) != ledger.StatusProcessing || h.results(consumer.WebhookBadSignature) != 1 {
		t.Fatalf("forged event: %d, status %s", resp.StatusCode, h.status(e))
	}

	if got := h.deliver(t, succeeded...); got[0] != http.StatusOK {
		t.Fatalf("delivery: %v", got)
	}
	after := h.record(t, e)
	if after.Status != ledger.StatusCharged || after.ChargeID != rec.ChargeID || h.results(consumer.WebhookApplied) != 1 {
		t.Fatalf("after the webhook: %+v", after)
	}
	if got := h.deliver(t, succeeded...); got[0] != http.StatusOK || h.results(consumer.WebhookDuplicate) != 1 {
		t.Fatalf("replayed event: %v", got)
	}
	if again := h.record(t, e); again.UpdatedAt != after.UpdatedAt || h.charges(e) != 1 || h.sim.ChargeCreates() != 1 {
		t.Fatalf("a replayed event must change nothing: %+v", again)
	}
	// The poll that follows finds nothing to do.
	h.advance(time.Hour)
	if res := h.followUp(t); res.Polled != 0 {
		t.Fatalf("a settled row is not polled: %+v", res)
	}
}

// Events out of order (the failure before the processing events) end in
// the right state, the same one polling alone reaches for a twin debit.
func TestWebhookOutOfOrderMatchesPolling(t *testing.T) {
	t.Parallel()
	hooked, polled := ev(1), ev(2)
	h := setupHooked(t, stripesim.Faults{DebitCustomers: []string{hooked.StripeCustomerID, polled.StripeCustomerID}})
	h.add(t, hooked, polled)
	for range 2 {
		if out := h.motion.deliver(t); out != consumer.OutcomeProcessing {
			t.Fatalf("outcome %s", out)
		}
	}
	for _, e := range []event.Event{hooked, polled} {
		if err := h.sim.Settle(h.record(t, e).ChargeID, false, "insufficient_funds"); err != nil {
			t.Fatal(err)
		}
	}
	var failedFirst, processingLater []string
	for _, ev := range h.sim.Events() {
		if !bytes.Contains(ev.Payload, []byte(hooked.StripeCustomerID)) {
			continue
		}
		switch ev.Type {
		case "charge.failed", "payment_intent.payment_failed":
			failedFirst = append(failedFirst, ev.ID)
		case "charge.pending", "payment_intent.processing":
			processingLater = append(processingLater, ev.ID)
		}
	}
	if len(failedFirst) != 2 || len(processingLater) != 2 {
		t.Fatalf("events: failed %v, processing %v", failedFirst, processingLater)
	}
	for _, code := range h.deliver(t, append(failedFirst, processingLater...)...) {
		if code != http.StatusOK {
			t.Fatalf("deliveries answered %d", code)
		}
	}
	// Webhooks off for the twin: the poll settles it.
	h.advance(2 * time.Minute)
	if res := h.followUp(t); res.Settled != 1 {
		t.Fatalf("the poll: %+v", res)
	}
	a, b := h.record(t, hooked), h.record(t, polled)
	for _, r := range []ledger.Record{a, b} {
		if r.Status != ledger.StatusDeclined || r.Attempt != 2 || r.FailureCode != "insufficient_funds" || r.NextAttemptAt.IsZero() ||
			r.CapReservedCents != 0 || r.ChargeID != "" {
			t.Fatalf("%s: %+v", r.Key, r)
		}
	}
	if !a.NextAttemptAt.Equal(b.NextAttemptAt.Add(-2*time.Minute)) || h.results(consumer.WebhookApplied) != 1 || h.results(consumer.WebhookIgnored) != 3 {
		t.Fatalf("webhook %v vs poll %v; applied %v ignored %v", a.NextAttemptAt, b.NextAttemptAt,
			h.results(consumer.WebhookApplied), h.results(consumer.WebhookIgnored))
	}
}

// A handler refuses a config without a whsec_ secret, and a GET.
func TestWebhookConfigAndMethod(t *testing.T) {
	t.Parallel()
	pool := testenv.DB(t)
	if _, err := consumer.WebhookHandler(consumer.WebhookConfig{DB: pool, Secret: "sk_test_oops"}); err == nil ||
		!strings.Contains(err.Error(), "PELGUARD_STRIPE_WEBHOOK_SECRET") || strings.Contains(err.Error(), "sk_test_oops") {
		t.Fatalf("want a clear error without the value, got %v", err)
	}
	h, err := consumer.WebhookHandler(consumer.WebhookConfig{DB: pool, Schema: testenv.SchemaOf(pool), Secret: testWebhookSecret})
	if err != nil {
		t.Fatal(err)
	}
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, httptest.NewRequest(http.MethodGet, consumer.WebhookPath, nil))
	if rr.Code != http.StatusMethodNotAllowed {
		t.Fatalf("GET: %d", rr.Code)
	}
}

// Remembered webhook events older than WebhookEventsKept are pruned by the
// handler that records new ones (Stripe retries an event for three days);
// younger ones, and the one just applied, are kept.
func TestWebhookPrunesOldEventIDs(t *testing.T) {
	t.Parallel()
	e := ev(3)
	h := setupHooked(t, stripesim.Faults{DebitCustomers: []string{e.StripeCustomerID}})
	ctx := context.Background()
	now := h.clk.Now()
	for i, age := range []time.Duration{consumer.WebhookEventsKept + time.Hour, consumer.WebhookEventsKept + 24*time.Hour, consumer.WebhookEventsKept - time.Hour} {
		if _, err := h.pool.Exec(ctx, `INSERT INTO webhook_events (event_id, type, object_id, received_at, result)
			VALUES ($1, 'charge.succeeded', 'ch_old', $2, 'applied')`, fmt.Sprintf("evt_old_%d", i), now.Add(-age)); err != nil {
			t.Fatal(err)
		}
	}
	h.add(t, e)
	if out := h.motion.deliver(t); out != consumer.OutcomeProcessing {
		t.Fatalf("outcome %s", out)
	}
	if err := h.sim.Settle(h.record(t, e).ChargeID, true, ""); err != nil {
		t.Fatal(err)
	}
	if got := h.deliver(t, h.eventIDs("charge.succeeded")...); got[0] != http.StatusOK || h.results(consumer.WebhookApplied) != 1 {
		t.Fatalf("delivery: %v", got)
	}
	var ids []string
	rows, err := h.pool.Query(ctx, `SELECT event_id FROM webhook_events ORDER BY received_at`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if len(ids) != 2 || ids[0] != "evt_old_2" || ids[1] != h.eventIDs("charge.succeeded")[0] {
		t.Fatalf("webhook events kept %v: want evt_old_2 and the one just applied", ids)
	}
}
