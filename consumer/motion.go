package consumer

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
)

// Money in motion and attempts (DESIGN.md invariants 4 and 10): what a
// Stripe answer other than "succeeded" or "declined for good" does to the
// ledger, and the ledger-driven retries and polls that follow once the
// stream entry was acked.

// Polls of a processing charge come after a quarter of its age, between
// these gaps: a debit that takes 4 days is read about 12 times.
const (
	pollMinGap = time.Minute
	pollMaxGap = 6 * time.Hour
	// followUpBatch bounds the polls and retries of one FollowUp.
	followUpBatch = 100
)

// attemptKey is the idempotency key of the row's current attempt: the
// row's own key for attempt 1 (the content hash, or a team's key that
// equals it), event.AttemptKey for later ones.
func (p *Processor) attemptKey(rec ledger.Record) string {
	if rec.Attempt <= 1 {
		return rec.IdempotencyKey
	}
	return event.AttemptKey(rec.CustomerID, rec.BillingPeriod, p.cfg.Namespace, rec.Attempt)
}

// closePreviousAttempt runs before attempt n >= 2 calls Stripe: attempt
// n-1's intent must never move money after attempt n is made. An open
// intent is cancelled; decidePrevious says what the intent allows.
// done=false means: go on with attempt n.
func (p *Processor) closePreviousAttempt(ctx context.Context, h *hold, rec ledger.Record, log *slog.Logger) (Outcome, bool, error) {
	if rec.Attempt <= 1 || rec.PaymentIntentID == "" {
		return "", false, nil
	}
	it, err := p.cfg.Stripe.GetIntent(ctx, rec.PaymentIntentID)
	if err == nil && it.Open() {
		it, err = p.cfg.Stripe.CancelIntent(ctx, rec.PaymentIntentID, "pelguard-cancel-"+rec.PaymentIntentID)
	}
	v, proceed := decidePrevious(rec, it, err, p.cfg.Clock.Now())
	if proceed {
		return "", false, nil
	}
	res, err := p.apply(ctx, h, redis.XMessage{}, rec, v, log)
	return res, true, err
}

// ledgerStream labels the metrics of ledger-driven retries.
const ledgerStream = "(ledger)"

// FollowUpResult counts what one FollowUp did.
type FollowUpResult struct {
	Polled, Settled, Retried, CapBlocked int
	Outcomes                             map[Outcome]int
}

// FollowUp is one pass of the ledger's own work, which no stream entry
// drives any more: it reads the pending charges of processing rows whose
// poll is due (Settle on a final answer) and charges the rows whose retry
// is due under their next attempt's key, through the same per-event code
// as a delivery. Several consumers may run it at once: rows are taken
// with SKIP LOCKED and every write is fenced. The consumer runs it every
// Config.FollowUpEvery; tests call it directly.
func (p *Processor) FollowUp(ctx context.Context) (FollowUpResult, error) {
	res := FollowUpResult{Outcomes: map[Outcome]int{}}
	rows, err := p.cfg.ledger.DuePolls(ctx, followUpBatch, pollMinGap, pollMaxGap)
	if err != nil {
		return res, err
	}
	for _, rec := range rows {
		res.Polled++
		settled, err := p.poll(ctx, rec)
		if err != nil {
			p.cfg.Logger.WarnContext(ctx, "polling a processing charge failed; the next poll retries",
				slog.String("key", rec.Key.String()), slog.String("charge_id", rec.ChargeID), slog.Any("error", err))
			continue
		}
		if settled {
			res.Settled++
		}
	}
	for range followUpBatch {
		due, ok, err := p.cfg.ledger.TakeDue(ctx, p.cfg.Name, p.cfg.Lease, capBlockedRetryGap, p.cfg.RequireCap)
		if err != nil {
			return res, err
		}
		if !ok {
			break
		}
		if due.CapErr != nil {
			// Held back by the cap: tried again within capBlockedRetryGap,
			// and said so every time (deduplicated per period), never
			// pushed back a day at a time in silence.
			res.CapBlocked++
			p.cfg.Notifier.Notify(decideCapBlocked(due.Record, due.CapErr))
			continue
		}
		out, err := p.redriveRow(ctx, due.Claim.Record)
		res.Retried++
		res.Outcomes[out]++
		if err != nil {
			p.cfg.Logger.WarnContext(ctx, "ledger retry left pending", slog.String("key", due.Record.Key.String()), slog.Any("error", err))
		}
	}
	return res, nil
}

// poll reads a processing row's charge at Stripe and settles the row when
// the charge is final.
func (p *Processor) poll(ctx context.Context, rec ledger.Record) (bool, error) {
	ch, err := p.cfg.Stripe.GetCharge(ctx, rec.ChargeID)
	if err != nil {
		return false, err
	}
	_, settled, err := settleCharge(ctx, p.cfg.ledger, p.cfg.Notifier, p.cfg.Retry, rec, ch.Status, ch.FailureCode, ch.FailureMessage)
	return settled, err
}

// settleCharge applies Stripe's status of a processing row's charge
// (polled, or from a webhook) as decideSettlement says: succeeded →
// charged; failed → declined, retried under the next attempt's key when the
// failure code allows a re-presentment and the policy has one left (else
// one alert); pending → nothing. A row that is no longer waiting for that
// charge is left alone.
func settleCharge(ctx context.Context, l *ledger.Ledger, n alerts.Notifier, policy RetryPolicy, rec ledger.Record,
	status, failureCode, failureMessage string) (ledger.Record, bool, error) {
	s, alert, final := decideSettlement(rec, status, failureCode, failureMessage, policy.withDefaults(), l.Now())
	if !final {
		return rec, false, nil
	}
	r, err := l.Settle(ctx, rec.Key, s)
	if errors.Is(err, ledger.ErrNotInMotion) {
		return rec, false, nil
	}
	if err != nil {
		return rec, false, err
	}
	if alert != nil {
		n.Notify(*alert)
	}
	return r, true, nil
}

// redriveRow charges a row TakeDue reopened: the per-event code with a
// hold that has no stream entry (nothing to ack or dead-letter).
func (p *Processor) redriveRow(ctx context.Context, rec ledger.Record) (out Outcome, err error) {
	h := p.hb.addLedger(ctx, rec.Key)
	defer p.hb.remove(h)
	h.setLease(&rec)
	ctx, span := p.startEvent(h, h.id, time.Time{})
	defer func() {
		endEvent(span, out, err)
		p.cfg.Metrics.event(ledgerStream, out)
	}()
	ev := event.Event{CustomerID: rec.CustomerID, BillingPeriod: rec.BillingPeriod, StripeCustomerID: rec.StripeCustomerID,
		AmountCents: rec.AmountCents, Currency: rec.Currency}
	log := p.cfg.Logger.With(slog.String("key", rec.Key.String()), slog.Int("attempt", rec.Attempt))
	return p.charge(ctx, h, redis.XMessage{}, ev, rec, log)
}
