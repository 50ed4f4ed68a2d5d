package consumer_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

// lostIntents is the real Stripe adapter, except that while broken is set
// an earlier attempt's intent answers Stripe's 404 (it reads an id the
// emulator does not know): the intent of a key revoked for the intents
// permission, of a deleted account, answers 403 or 404 for good.
type lostIntents struct {
	consumer.Stripe
	broken atomic.Bool
}

func (s *lostIntents) GetIntent(ctx context.Context, id string) (stripeapi.Intent, error) {
	if s.broken.Load() {
		id = "pi_unknown_" + id
	}
	return s.Stripe.GetIntent(ctx, id)
}

// Issue 25 item 3: a ledger-driven retry whose earlier attempt's intent
// cannot be closed is never charged by guess, and no longer loops: the
// ledger takes it over MaxLedgerTakeovers times, ever further apart, then
// parks it with one alert; it stays pending and unbilled; `consumer retry`
// (ScheduleRetries) takes it up once the cause is gone, and it is billed
// once.
func TestLedgerRetryOfUnclosableIntentParks(t *testing.T) {
	t.Parallel()
	e := ev(1)
	var stripe *lostIntents
	m := setupMotion(t, stripesim.Faults{DeclineCodes: map[string]string{e.StripeCustomerID: "insufficient_funds"}},
		func(c *consumer.Config) {
			stripe = &lostIntents{Stripe: c.Stripe}
			c.Stripe = stripe
		})
	m.add(t, e)
	if out := m.deliver(t); out != consumer.OutcomeDeclined {
		t.Fatalf("outcome %s", out)
	}
	if r := m.record(t, e); r.PaymentIntentID == "" || r.NextAttemptAt.IsZero() {
		t.Fatalf("a soft decline with its intent, retried by the ledger: %+v", r)
	}
	f := m.sim.Faults()
	f.DeclineCodes = nil
	if err := m.sim.SetFaults(f); err != nil {
		t.Fatal(err)
	}
	stripe.broken.Store(true)

	tries := 0
	for range 48 { // two days of hourly follow-ups: the old loop took the row over every minute
		m.advance(time.Hour)
		tries += m.followUp(t).Retried
	}
	r := m.record(t, e)
	if !r.Parked() || r.Status != ledger.StatusPending || r.LeaseOwner != "" || !strings.Contains(r.ParkedReason, "payment intent") {
		t.Fatalf("after %d tries the row must be parked, pending and released: %+v", tries, r)
	}
	if tries != consumer.MaxLedgerTakeovers+1 {
		t.Fatalf("tries %d, want the reopening and %d takeovers", tries, consumer.MaxLedgerTakeovers)
	}
	if k := m.kinds(); k[alerts.KindRetryParked] != 1 || len(m.alerts.Alerts()) != 1 {
		t.Fatalf("alerts %v: want one retry_parked", k)
	}
	if m.charges(e) != 0 || m.sim.ChargeCreates() != 1 {
		t.Fatalf("nothing may be charged while attempt 1's intent is unknown: %d charges, %d creates", m.charges(e), m.sim.ChargeCreates())
	}

	// A person looked: the intent reads again. Unparked, it is charged
	// once, under attempt 2's key, after attempt 1's intent is cancelled.
	stripe.broken.Store(false)
	recs, err := m.ledger.ScheduleRetries(context.Background(), []ledger.Key{ledger.EventKey(e)}, "")
	if err != nil || len(recs) != 1 || recs[0].Parked() {
		t.Fatalf("unparking: %v %+v", err, recs)
	}
	if res := m.followUp(t); res.Retried != 1 || res.Outcomes[consumer.OutcomeCharged] != 1 {
		t.Fatalf("the retry after unparking: %+v", res)
	}
	if r := m.record(t, e); r.Status != ledger.StatusCharged || r.Attempt != 2 || m.charges(e) != 1 {
		t.Fatalf("billed once: %+v, %d charges", r, m.charges(e))
	}
}

// Issue 25 item 6: a retry the spend cap holds back (no cap under
// --require-cap) says so, and is tried again within the hour once the cap
// is set — not pushed back by --decline-retry-after (a day) in silence.
func TestCapBlockedRetryAlertsAndResumes(t *testing.T) {
	t.Parallel()
	e := ev(1)
	m := setupMotion(t, stripesim.Faults{DeclineCodes: map[string]string{e.StripeCustomerID: "insufficient_funds"}},
		func(c *consumer.Config) {
			c.RequireCap = true
			c.Retry.After = 2 * time.Hour
		})
	ctx := context.Background()
	if _, err := m.ledger.SetCap(ctx, e.BillingPeriod, 100_000); err != nil {
		t.Fatal(err)
	}
	m.add(t, e)
	if out := m.deliver(t); out != consumer.OutcomeDeclined {
		t.Fatalf("outcome %s", out)
	}
	f := m.sim.Faults()
	f.DeclineCodes = nil
	if err := m.sim.SetFaults(f); err != nil {
		t.Fatal(err)
	}
	if _, err := m.pool.Exec(ctx, `DELETE FROM `+testenv.SchemaOf(m.pool)+`.spend_caps`); err != nil {
		t.Fatal(err)
	}
	m.advance(2 * time.Hour)
	if res := m.followUp(t); res.CapBlocked != 1 || res.Retried != 0 {
		t.Fatalf("the retry without a cap: %+v", res)
	}
	if k := m.kinds(); k[alerts.KindRetryBlocked] != 1 {
		t.Fatalf("alerts %v: want retry_blocked", k)
	}
	if _, err := m.ledger.SetCap(ctx, e.BillingPeriod, 100_000); err != nil {
		t.Fatal(err)
	}
	m.advance(time.Hour)
	if res := m.followUp(t); res.Retried != 1 || res.Outcomes[consumer.OutcomeCharged] != 1 {
		t.Fatalf("within the hour after the cap was set: %+v", res)
	}
	if m.charges(e) != 1 {
		t.Fatalf("charges %d", m.charges(e))
	}
}

// Issue 25 item 5: a webhook built with an unset policy decides as the
// consumer does (the defaults: a retryable failed debit is re-presented),
// not the opposite (no retry, an alert).
func TestWebhookUnsetPolicyIsTheDefault(t *testing.T) {
	t.Parallel()
	e := ev(1)
	h := setupHooked(t, stripesim.Faults{DebitCustomers: []string{e.StripeCustomerID}}, consumer.RetryPolicy{})
	h.add(t, e)
	if out := h.motion.deliver(t); out != consumer.OutcomeProcessing {
		t.Fatalf("outcome %s", out)
	}
	if err := h.sim.Settle(h.record(t, e).ChargeID, false, "insufficient_funds"); err != nil {
		t.Fatal(err)
	}
	h.deliver(t, h.eventIDs("charge.failed")...)
	r := h.record(t, e)
	if r.Status != ledger.StatusDeclined || r.NextAttemptAt.IsZero() || !r.Debit {
		t.Fatalf("a retryable failed debit under the default policy: %+v", r)
	}
	if len(h.alerts.Alerts()) != 0 {
		t.Fatalf("a debit that is re-presented is not an alert: %v", h.kinds())
	}
	if got := r.NextAttemptAt.Sub(h.clk.Now()); got != consumer.DefaultDeclineRetryAfter {
		t.Fatalf("retry in %s, want the default %s", got, consumer.DefaultDeclineRetryAfter)
	}
}

// Issue 25 item 7: RetryRefusal keeps a person's retry inside the rules
// of bank debits (no re-presentment after debit_not_authorized or two
// re-presentments) while cards and retryable debits pass.
func TestRetryRefusal(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		rec    ledger.Record
		refuse bool
	}{
		{"card hard decline", ledger.Record{Status: ledger.StatusDeclined, FailureCode: "stolen_card", Attempt: 2}, false},
		{"debit insufficient funds, first failure", ledger.Record{Status: ledger.StatusDeclined, Debit: true, FailureCode: "insufficient_funds", Attempt: 2}, false},
		{"debit insufficient funds, 2 re-presentments used", ledger.Record{Status: ledger.StatusDeclined, Debit: true, FailureCode: "insufficient_funds", Attempt: 4}, true},
		{"debit not authorized", ledger.Record{Status: ledger.StatusDeclined, Debit: true, FailureCode: "debit_not_authorized", Attempt: 2}, true},
		{"debit account closed", ledger.Record{Status: ledger.StatusDeclined, Debit: true, FailureCode: "account_closed", Attempt: 2}, true},
		{"failed (permanent error)", ledger.Record{Status: ledger.StatusFailed, Attempt: 2}, false},
	} {
		if got := c.rec.RetryRefusal() != ""; got != c.refuse {
			t.Errorf("%s: refused %v (%q), want %v", c.name, got, c.rec.RetryRefusal(), c.refuse)
		}
	}
}

// Issue 25 item 4: processing_error sent as the error's code (no
// decline_code; test card 4000000000000119) is a soft decline, as when it
// is a card_declined's decline_code: retried under attempt 2's key with no
// alert, then billed once. Before, the consumer classified by decline_code
// alone and called it hard: final, unbilled, a "hard decline" alert.
func TestProcessingErrorIsRetriedInBothForms(t *testing.T) {
	t.Parallel()
	asCode, asDecline := ev(1), ev(2)
	m := setupMotion(t, stripesim.Faults{
		CardErrorCodes: map[string]string{asCode.StripeCustomerID: "processing_error"},
		DeclineCodes:   map[string]string{asDecline.StripeCustomerID: "processing_error"},
	}, nil)
	m.add(t, asCode, asDecline)
	for range 2 {
		if out := m.deliver(t); out != consumer.OutcomeDeclined {
			t.Fatalf("outcome %s", out)
		}
	}
	for _, e := range []event.Event{asCode, asDecline} {
		if r := m.record(t, e); r.NextAttemptAt.IsZero() || r.FailureCode != "processing_error" {
			t.Fatalf("%s: a soft decline must be retried: %+v", e.CustomerID, r)
		}
	}
	if len(m.alerts.Alerts()) != 0 {
		t.Fatalf("a retried soft decline is not an alert: %v", m.kinds())
	}
	if err := m.sim.SetFaults(stripesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	m.advance(time.Hour)
	if res := m.followUp(t); res.Outcomes[consumer.OutcomeCharged] != 2 {
		t.Fatalf("the retries: %+v", res)
	}
	for _, e := range []event.Event{asCode, asDecline} {
		if m.charges(e) != 1 {
			t.Fatalf("%s: %d charges", e.CustomerID, m.charges(e))
		}
	}
}
