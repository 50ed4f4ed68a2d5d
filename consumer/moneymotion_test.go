package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/stripeapi"
)

// motion is one money-in-motion test's world: a frozen clock shared by the
// ledger and the emulator, and a processor whose alerts are recorded.
type motion struct {
	*bundle
	clk    *clock.Sim
	alerts *alerts.Memory
	p      *consumer.Processor
	cfg    consumer.Config
}

var motionStart = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func setupMotion(t *testing.T, faults stripesim.Faults, tune func(*consumer.Config)) *motion {
	t.Helper()
	return setupMotionWebhook(t, stripesim.Webhook{}, faults, tune)
}

func setupMotionWebhook(t *testing.T, wh stripesim.Webhook, faults stripesim.Faults, tune func(*consumer.Config)) *motion {
	t.Helper()
	clk := clock.NewSim(motionStart)
	b := setup(t, opts{clk: clk, simNow: motionStart, webhook: wh})
	if err := b.sim.SetFaults(faults); err != nil {
		t.Fatal(err)
	}
	m := &motion{bundle: b, clk: clk, alerts: alerts.NewMemory()}
	m.cfg = b.config(t, "consumer-A")
	m.cfg.Notifier = m.alerts
	m.cfg.FollowUpEvery = -1
	m.cfg.Retry.After = time.Hour
	m.cfg.Lease = time.Minute
	if tune != nil {
		tune(&m.cfg)
	}
	m.p = processor(t, m.cfg)
	return m
}

// advance moves the ledger's and the emulator's clocks together.
func (m *motion) advance(d time.Duration) {
	m.clk.Advance(d)
	m.sim.Advance(d)
}

// deliver reads the next entry as consumer-A and processes it.
func (m *motion) deliver(t *testing.T) consumer.Outcome {
	t.Helper()
	msgs := m.read(t, "consumer-A", 1)
	if len(msgs) != 1 {
		t.Fatalf("want one entry, got %d", len(msgs))
	}
	out, err := m.p.Process(context.Background(), m.stream, msgs[0])
	if err != nil {
		t.Fatalf("process: %v (%s)", err, out)
	}
	return out
}

func (m *motion) followUp(t *testing.T) consumer.FollowUpResult {
	t.Helper()
	res, err := m.p.FollowUp(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// chargesOf lists the emulator's charges of an event's Stripe customer.
func (m *motion) chargesOf(e event.Event) []stripesim.Charge {
	var out []stripesim.Charge
	for _, ch := range m.sim.Charges() {
		if ch.Customer == e.StripeCustomerID {
			out = append(out, ch)
		}
	}
	return out
}

func (m *motion) kinds() map[alerts.Kind]int {
	out := map[alerts.Kind]int{}
	for _, a := range m.alerts.Alerts() {
		out[a.Kind]++
	}
	return out
}

// A bank debit that settles after 3 days: processing on the day (acked,
// never charged twice, polled with backoff), charged on settlement, one
// charge.
func TestDebitSettlesAfterThreeDays(t *testing.T) {
	t.Parallel()
	e := ev(1)
	m := setupMotion(t, stripesim.Faults{DebitCustomers: []string{e.StripeCustomerID}}, nil)
	m.add(t, e)
	if out := m.deliver(t); out != consumer.OutcomeProcessing {
		t.Fatalf("outcome %s, want processing", out)
	}
	rec := m.record(t, e)
	if rec.Status != ledger.StatusProcessing || rec.ChargeID == "" || rec.PaymentIntentID == "" || m.pending(t) != 0 {
		t.Fatalf("after the create call: %+v, pending %d", rec, m.pending(t))
	}
	polls := 0
	for day := 0; day < 3; day++ {
		m.advance(24 * time.Hour)
		res := m.followUp(t)
		polls += res.Polled
		if res.Settled != 0 || m.status(e) != ledger.StatusProcessing {
			t.Fatalf("day %d: settled %d, status %s", day+1, res.Settled, m.status(e))
		}
	}
	if err := m.sim.Settle(rec.ChargeID, true, ""); err != nil {
		t.Fatal(err)
	}
	m.advance(6 * time.Hour)
	if res := m.followUp(t); res.Settled != 1 {
		t.Fatalf("the settled debit was not recorded: %+v", res)
	}
	got := m.record(t, e)
	if got.Status != ledger.StatusCharged || got.ChargeID != rec.ChargeID || got.Attempt != 1 {
		t.Fatalf("after settlement: %+v", got)
	}
	if m.charges(e) != 1 || m.sim.ChargeCreates() != 1 || polls != 3 {
		t.Fatalf("charges %d, creates %d, polls %d", m.charges(e), m.sim.ChargeCreates(), polls)
	}
	if len(m.alerts.Alerts()) != 0 {
		t.Fatalf("a debit in motion is not an alert: %v", m.kinds())
	}
}

// A debit that fails with a retryable code is billed again once, under
// attempt 2's key, after attempt 1's intent is cancelled; one that fails
// with account_closed is never re-presented and alerts once.
func TestFailedDebitRetriedUnderAttempt2Key(t *testing.T) {
	t.Parallel()
	e, closed := ev(1), ev(2)
	m := setupMotion(t, stripesim.Faults{DebitCustomers: []string{e.StripeCustomerID, closed.StripeCustomerID}}, nil)
	m.add(t, e, closed)
	for range 2 {
		if out := m.deliver(t); out != consumer.OutcomeProcessing {
			t.Fatalf("outcome %s", out)
		}
	}
	first := m.record(t, e)
	if err := m.sim.Settle(first.ChargeID, false, "insufficient_funds"); err != nil {
		t.Fatal(err)
	}
	if err := m.sim.Settle(m.record(t, closed).ChargeID, false, "account_closed"); err != nil {
		t.Fatal(err)
	}
	m.advance(2 * time.Minute)
	if res := m.followUp(t); res.Settled != 2 || res.Retried != 0 {
		t.Fatalf("settling: %+v", res)
	}
	failed := m.record(t, e)
	if failed.Status != ledger.StatusDeclined || failed.Attempt != 2 || failed.NextAttemptAt.IsZero() || failed.FailureCode != "insufficient_funds" {
		t.Fatalf("a retryable failed debit: %+v", failed)
	}
	if r := m.record(t, closed); r.Status != ledger.StatusDeclined || !r.NextAttemptAt.IsZero() {
		t.Fatalf("account_closed must be final: %+v", r)
	}
	if k := m.kinds(); k[alerts.KindChargeDeclined] != 1 || len(m.alerts.Alerts()) != 1 {
		t.Fatalf("alerts %v: want one charge_declined (account_closed)", k)
	}

	m.advance(time.Hour)
	if res := m.followUp(t); res.Retried != 1 || res.Outcomes[consumer.OutcomeProcessing] != 1 {
		t.Fatalf("the retry: %+v", res)
	}
	second := m.record(t, e)
	if err := m.sim.Settle(second.ChargeID, true, ""); err != nil {
		t.Fatal(err)
	}
	m.advance(2 * time.Minute)
	m.followUp(t)
	final := m.record(t, e)
	chs := m.chargesOf(e)
	if final.Status != ledger.StatusCharged || final.Attempt != 2 || len(chs) != 2 || m.charges(e) != 1 {
		t.Fatalf("final %+v, %d charges at Stripe, %d succeeded", final, len(chs), m.charges(e))
	}
	want := event.AttemptKey(e.CustomerID, e.BillingPeriod, "test", 2)
	for _, ch := range chs {
		switch ch.ID {
		case first.ChargeID:
			if ch.IdempotencyKey != first.IdempotencyKey || ch.Status != "failed" {
				t.Fatalf("attempt 1's charge: %+v", ch)
			}
		case final.ChargeID:
			if ch.IdempotencyKey != want || ch.Metadata[stripeapi.MetaAttempt] != "2" ||
				ch.Metadata[stripeapi.MetaIdempotencyKey] != first.IdempotencyKey {
				t.Fatalf("attempt 2's charge must use attempt 2's key and keep the row's key in metadata: %+v", ch)
			}
		default:
			t.Fatalf("unexpected charge %+v", ch)
		}
	}
	if it, _ := m.stripe.GetIntent(context.Background(), first.PaymentIntentID); it.Status != "canceled" {
		t.Fatalf("attempt 1's intent must be cancelled before attempt 2, is %s", it.Status)
	}
}

// A takeover 25 h into a debit's processing, by a consumer whose
// predecessor died between Stripe's reply and the ledger write, finds the
// pending debit at Stripe and records it: no second debit.
func TestTakeoverPast25hDuringProcessing(t *testing.T) {
	t.Parallel()
	e := ev(1)
	m := setupMotion(t, stripesim.Faults{DebitCustomers: []string{e.StripeCustomerID}}, nil)
	ids := m.add(t, e)
	m.read(t, "consumer-A", 1)
	// consumer-A reserved the row and Stripe debited, then A died.
	claim, err := m.ledger.Reserve(context.Background(), ledger.ReserveRequest{Event: e, IdempotencyKey: e.Key("test"),
		Owner: "consumer-A", Lease: time.Minute, MessageID: ids[0]})
	if err != nil || claim.Decision != ledger.Acquired {
		t.Fatalf("reserve: %v %v", claim.Decision, err)
	}
	ch, err := m.stripe.Charge(context.Background(), stripeapi.ChargeRequest{IdempotencyKey: e.Key("test"), StripeCustomerID: e.StripeCustomerID,
		AmountCents: e.AmountCents, Currency: e.Currency, Description: "Usage billing for 2026-11",
		Metadata: stripeapi.PelguardMetadata(e.CustomerID, e.BillingPeriod, e.Key("test"))})
	if err != nil || ch.Status != "pending" {
		t.Fatalf("the first debit: %+v %v", ch, err)
	}
	m.advance(25 * time.Hour)
	cfgB := m.cfg
	cfgB.Name = "consumer-B"
	pB := processor(t, cfgB)
	msgs := m.claim(t, "consumer-B", ids...)
	out, err := pB.Process(context.Background(), m.stream, msgs[0])
	if out != consumer.OutcomeProcessing || err != nil {
		t.Fatalf("takeover: %s %v", out, err)
	}
	if rec := m.record(t, e); rec.Status != ledger.StatusProcessing || rec.ChargeID != ch.ID || m.sim.ChargeCreates() != 1 {
		t.Fatalf("takeover must record the pending debit, not debit again: %+v, creates %d", rec, m.sim.ChargeCreates())
	}
	// A redelivery of the entry (AOF rollback) while it is processing is
	// acked without a call.
	m.add(t, e)
	if out := m.deliver(t); out != consumer.OutcomeAlreadyBilled || m.sim.ChargeCreates() != 1 {
		t.Fatalf("redelivery while processing: %s, creates %d", out, m.sim.ChargeCreates())
	}
}

// A soft decline is retried under attempt 2's key and succeeds: one charge,
// no alert. A hard decline is never retried and alerts once. The last soft
// retry failing alerts once.
func TestDeclines(t *testing.T) {
	t.Parallel()
	soft, hard, exhausted := ev(1), ev(2), ev(3)
	m := setupMotion(t, stripesim.Faults{DeclineCodes: map[string]string{
		soft.StripeCustomerID: "insufficient_funds", hard.StripeCustomerID: "stolen_card", exhausted.StripeCustomerID: "do_not_honor",
	}}, func(c *consumer.Config) { c.Retry.Retries = 1 })
	m.add(t, soft, hard, exhausted)
	for range 3 {
		if out := m.deliver(t); out != consumer.OutcomeDeclined {
			t.Fatalf("outcome %s", out)
		}
	}
	if k := m.kinds(); k[alerts.KindChargeDeclined] != 1 || len(m.alerts.Alerts()) != 1 {
		t.Fatalf("only the hard decline alerts at once: %v", k)
	}
	if r := m.record(t, hard); !r.NextAttemptAt.IsZero() || r.FailureCode != "stolen_card" {
		t.Fatalf("hard decline must be final: %+v", r)
	}
	// Still declining before the retry is due: nothing happens.
	if res := m.followUp(t); res.Retried != 0 {
		t.Fatalf("retry before it is due: %+v", res)
	}
	f := m.sim.Faults()
	f.DeclineCodes = map[string]string{hard.StripeCustomerID: "stolen_card", exhausted.StripeCustomerID: "do_not_honor"}
	if err := m.sim.SetFaults(f); err != nil {
		t.Fatal(err)
	}
	m.advance(time.Hour)
	res := m.followUp(t)
	if res.Retried != 2 || res.Outcomes[consumer.OutcomeCharged] != 1 || res.Outcomes[consumer.OutcomeDeclined] != 1 {
		t.Fatalf("retries: %+v", res)
	}
	if r := m.record(t, soft); r.Status != ledger.StatusCharged || r.Attempt != 2 || m.charges(soft) != 1 {
		t.Fatalf("soft decline then success: %+v, %d charges", r, m.charges(soft))
	}
	if r := m.record(t, exhausted); r.Status != ledger.StatusDeclined || !r.NextAttemptAt.IsZero() || r.Attempt != 3 {
		t.Fatalf("the last retry failed: %+v", r)
	}
	if k := m.kinds(); k[alerts.KindChargeDeclined] != 2 || len(m.alerts.Alerts()) != 2 {
		t.Fatalf("the last soft retry failing alerts once: %v", k)
	}
	m.advance(48 * time.Hour)
	if res := m.followUp(t); res.Retried != 0 || m.charges(hard) != 0 {
		t.Fatalf("a hard decline or an exhausted one is never retried: %+v", res)
	}
}

// requires_action (off-session authentication) and a missing payment
// method become action_required with an alert naming the need and a dead
// letter; once fixed, the replay charges once under the next attempt's key.
func TestActionRequiredFixedAndReplayed(t *testing.T) {
	t.Parallel()
	auth, nopm := ev(1), ev(2)
	m := setupMotion(t, stripesim.Faults{AuthRequiredCustomers: []string{auth.StripeCustomerID},
		NoPaymentMethodCustomers: []string{nopm.StripeCustomerID}}, nil)
	m.add(t, auth, nopm)
	for range 2 {
		if out := m.deliver(t); out != consumer.OutcomeActionRequired {
			t.Fatalf("outcome %s", out)
		}
	}
	for _, e := range []event.Event{auth, nopm} {
		if r := m.record(t, e); r.Status != ledger.StatusActionRequired || r.Attempt != 2 || r.CapReservedCents != 0 {
			t.Fatalf("%s: %+v", e.CustomerID, r)
		}
	}
	if k := m.kinds(); k[alerts.KindActionRequired] != 2 {
		t.Fatalf("alerts %v", k)
	}
	// A plain redelivery (no replay) changes nothing.
	m.add(t, auth)
	if out := m.deliver(t); out != consumer.OutcomeAlreadyBilled {
		t.Fatalf("redelivery of an action_required row: %s", out)
	}
	if err := m.sim.SetFaults(stripesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	// One replayed with the reason's replay, the other alone (the
	// console's replay of one dead letter): both charge again.
	got, err := consumer.ReplayDeadLetters(context.Background(), m.rdb, m.stream, consumer.ReasonActionRequired, 1, false)
	if err != nil || len(got) != 1 {
		t.Fatalf("replay: %v %v", got, err)
	}
	left := m.rdb.XRange(context.Background(), consumer.DeadLetterStream(m.stream), "-", "+").Val()
	if len(left) != 1 {
		t.Fatalf("%d dead letters left after replaying one", len(left))
	}
	if _, err := consumer.ReplayDeadLetter(context.Background(), m.rdb, m.stream, left[0].ID); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if out := m.deliver(t); out != consumer.OutcomeCharged {
			t.Fatalf("replayed: %s", out)
		}
	}
	for _, e := range []event.Event{auth, nopm} {
		r := m.record(t, e)
		if r.Status != ledger.StatusCharged || m.charges(e) != 1 {
			t.Fatalf("%s after the replay: %+v, %d charges", e.CustomerID, r, m.charges(e))
		}
		ch, _ := m.sim.Charge(r.ChargeID)
		if ch.IdempotencyKey != event.AttemptKey(e.CustomerID, e.BillingPeriod, "test", 2) {
			t.Fatalf("the replay must charge under attempt 2's key, got %s", ch.IdempotencyKey)
		}
	}
	// Replaying once more (a crash between XADD and XDEL) is acked.
	m.add(t, auth)
	if out := m.deliver(t); out != consumer.OutcomeAlreadyBilled || m.charges(auth) != 1 {
		t.Fatalf("second replay: %s", out)
	}
}

// The attempt key changes only when a final failure was recorded: a
// transient failure keeps attempt 1's key; and two consumers racing one
// due retry make one charge.
func TestAttemptKeyAndRacingRetries(t *testing.T) {
	t.Parallel()
	e := ev(1)
	m := setupMotion(t, stripesim.Faults{DeclineCodes: map[string]string{e.StripeCustomerID: "try_again_later"}}, nil)
	m.add(t, e)
	if out := m.deliver(t); out != consumer.OutcomeDeclined {
		t.Fatalf("outcome %s", out)
	}
	r := m.record(t, e)
	if r.Attempt != 2 || r.IdempotencyKey != e.Key("test") {
		t.Fatalf("after the decline: %+v", r)
	}
	if err := m.sim.SetFaults(stripesim.Faults{ErrorRate: 1}); err != nil {
		t.Fatal(err)
	}
	m.advance(time.Hour)
	if res := m.followUp(t); res.Retried != 1 || res.Outcomes[consumer.OutcomeRetryLater] != 1 {
		t.Fatalf("a 500 must leave the retry pending: %+v", res)
	}
	if r := m.record(t, e); r.Attempt != 2 || r.Status != ledger.StatusPending {
		t.Fatalf("a transient failure must not advance the attempt: %+v", r)
	}
	// The released row is ledger-driven: no stream entry comes back for
	// it, so the next FollowUp takes it over, within attempt 2, with the
	// same key. Two consumers race for it.
	if r := m.record(t, e); r.StreamMessageID != ledger.LedgerDriven || r.LeaseOwner != "" {
		t.Fatalf("released retry: %+v", r)
	}
	if err := m.sim.SetFaults(stripesim.Faults{Latency: stripesim.Latency{Fixed: 50 * time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	if res := m.followUp(t); res.Retried != 0 {
		t.Fatalf("a released retry waits %s: %+v", ledger.ReleasedRetryDelay, res)
	}
	m.advance(ledger.ReleasedRetryDelay)
	cfgB := m.cfg
	cfgB.Name = "consumer-B"
	pB := processor(t, cfgB)
	var wg sync.WaitGroup
	for _, p := range []*consumer.Processor{m.p, pB} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := p.FollowUp(context.Background()); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	r = m.record(t, e)
	if r.Status != ledger.StatusCharged || m.charges(e) != 1 || len(m.chargesOf(e)) != 2 || r.Attempt != 2 {
		t.Fatalf("racing retries: %+v, %d succeeded, %d in all", r, m.charges(e), len(m.chargesOf(e)))
	}
	if ch, _ := m.sim.Charge(r.ChargeID); ch.IdempotencyKey != event.AttemptKey(e.CustomerID, e.BillingPeriod, "test", 2) {
		t.Fatalf("the takeover must keep attempt 2's key, got %s", ch.IdempotencyKey)
	}
}

// The measurement: 30 customers, 30 % soft-declined on the first
// attempt (9 of them). Before, 9 stayed unbilled; now every one is billed
// once after one ledger retry, with no alert.
func TestSoftDeclineRateAllBilled(t *testing.T) {
	t.Parallel()
	codes := map[string]string{}
	var evs []event.Event
	for i := range 30 {
		e := ev(100 + i)
		evs = append(evs, e)
		if i%10 < 3 {
			codes[e.StripeCustomerID] = stripesim.SoftDeclineCodes[i%len(stripesim.SoftDeclineCodes)]
		}
	}
	m := setupMotion(t, stripesim.Faults{DeclineCodes: codes}, nil)
	m.add(t, evs...)
	declined := 0
	for range evs {
		if m.deliver(t) == consumer.OutcomeDeclined {
			declined++
		}
	}
	if declined != 9 {
		t.Fatalf("%d declined on the first attempt, want 9", declined)
	}
	if err := m.sim.SetFaults(stripesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	m.advance(time.Hour)
	if res := m.followUp(t); res.Retried != 9 || res.Outcomes[consumer.OutcomeCharged] != 9 {
		t.Fatalf("retries: %+v", res)
	}
	for _, e := range evs {
		if m.charges(e) != 1 || m.status(e) != ledger.StatusCharged {
			t.Fatalf("%s: %d charges, %s", e.CustomerID, m.charges(e), m.status(e))
		}
	}
	if len(m.alerts.Alerts()) != 0 {
		t.Fatalf("soft declines that a retry fixed alert nobody: %v", m.kinds())
	}
}
