package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/stripeapi"
)

// Money in motion and attempts (DESIGN.md invariants 4 and 10): what a
// Stripe answer other than "succeeded" or "declined for good" does to the
// ledger, and the ledger-driven retries and polls that follow once the
// stream entry was acked.

// Retry defaults.
const (
	DefaultDeclineRetries    = 3
	DefaultDeclineRetryAfter = 24 * time.Hour
	// NoDeclineRetries turns retries of soft declines and failed debits off
	// (Config.DeclineRetries; the CLI's 0).
	NoDeclineRetries = -1
	// Polls of a processing charge come after a quarter of its age,
	// between these gaps: a debit that takes 4 days is read about 12 times.
	pollMinGap = time.Minute
	pollMaxGap = 6 * time.Hour
	// followUpBatch bounds the polls and retries of one FollowUp.
	followUpBatch = 100
)

// RetryPolicy says whether and when a final failure of attempt n is tried
// again under attempt n+1's key.
type RetryPolicy struct {
	// Retries is how many attempts may follow the first (NoDeclineRetries:
	// none). Bank debits are re-presented at most
	// stripeapi.MaxDebitRepresentments times whatever it says.
	Retries int
	// After is the wait before each retry.
	After time.Duration
}

// retryAt is when attempt+1 runs after attempt failed with a retryable
// code, or zero when no retry is left.
func (r RetryPolicy) retryAt(now time.Time, attempt int, debit bool) time.Time {
	limit := r.Retries
	if debit {
		limit = min(limit, stripeapi.MaxDebitRepresentments)
	}
	if limit <= 0 || attempt-1 >= limit {
		return time.Time{}
	}
	return now.Add(r.After)
}

func (c *Config) retryPolicy() RetryPolicy {
	return RetryPolicy{Retries: c.DeclineRetries, After: c.DeclineRetryAfter}
}

// attemptKey is the idempotency key of the row's current attempt: the
// row's own key for attempt 1 (the content hash, or a team's key that
// equals it), event.AttemptKey for later ones.
func (p *Processor) attemptKey(rec ledger.Record) string {
	if rec.Attempt <= 1 {
		return rec.IdempotencyKey
	}
	return event.AttemptKey(rec.CustomerID, rec.BillingPeriod, p.cfg.Namespace, rec.Attempt)
}

// stripeRef is the adapter's typed error of err, or an empty one.
func stripeRef(err error) stripeapi.Error {
	var se *stripeapi.Error
	if errors.As(err, &se) {
		return *se
	}
	return stripeapi.Error{}
}

// recordFound records a charge Stripe made for the row's key: charged, or
// processing while it is a pending bank debit.
func (p *Processor) recordFound(ctx context.Context, h *hold, rec ledger.Record, ch stripeapi.Charge) (Outcome, error) {
	if ch.Status == "pending" {
		o := ledger.Outcome{Status: ledger.StatusProcessing, ChargeID: ch.ID, PaymentIntentID: ch.PaymentIntentID,
			PollAt: p.cfg.Clock.Now().Add(pollMinGap)}
		return p.finish(ctx, h, rec, o, OutcomeProcessing)
	}
	return p.finish(ctx, h, rec, ledger.Outcome{Status: ledger.StatusCharged, ChargeID: ch.ID}, OutcomeCharged)
}

// declined records a refused card: a soft decline with retries left is
// retried by the ledger under the next attempt's key (no alert); a hard
// one, or the last soft one, is final and alerts once.
func (p *Processor) declined(ctx context.Context, h *hold, rec ledger.Record, err error, log *slog.Logger) (Outcome, error) {
	se := stripeRef(err)
	o := ledger.Outcome{Status: ledger.StatusDeclined, Error: err.Error(), FailureCode: se.DeclineCode, PaymentIntentID: se.PaymentIntentID}
	hard := stripeapi.ClassifyDecline(se.DeclineCode) == stripeapi.DeclineHard
	if !hard {
		o.RetryAt = p.cfg.retryPolicy().retryAt(p.cfg.Clock.Now(), rec.Attempt, false)
	}
	res, ferr := p.finish(ctx, h, rec, o, OutcomeDeclined)
	if ferr != nil || res == OutcomeLeaseLost {
		return res, ferr
	}
	if !o.RetryAt.IsZero() {
		log.InfoContext(ctx, "soft decline: retrying under the next attempt's key", slog.String("decline_code", se.DeclineCode),
			slog.Int("attempt", rec.Attempt), slog.Time("retry_at", o.RetryAt))
		return res, nil
	}
	p.cfg.Notifier.Notify(alerts.ChargeDeclined(alerts.Decline{CustomerID: rec.CustomerID, Period: rec.BillingPeriod,
		Code: se.DeclineCode, Hard: hard, Attempt: rec.Attempt}))
	return res, nil
}

// actionRequired records a charge Stripe cannot make without the customer,
// alerts naming what is needed, and parks the entry for the replay that
// charges again once it is fixed.
func (p *Processor) actionRequired(ctx context.Context, h *hold, msg redis.XMessage, rec ledger.Record, err error) (Outcome, error) {
	se := stripeRef(err)
	need := se.Message
	o := ledger.Outcome{Status: ledger.StatusActionRequired, Error: err.Error(), FailureCode: se.DeclineCode, PaymentIntentID: se.PaymentIntentID}
	if res, ferr := p.finishOnly(ctx, rec, o); ferr != nil || res == OutcomeLeaseLost {
		return res, ferr
	}
	p.cfg.Notifier.Notify(alerts.ActionRequired(rec.CustomerID, rec.BillingPeriod, need))
	return p.deadLetter(ctx, h.stream, msg, ReasonActionRequired, need, OutcomeActionRequired)
}

// closePreviousAttempt runs before attempt n >= 2 calls Stripe: attempt
// n-1's intent must never move money after attempt n is made. An open
// intent is cancelled; one that succeeded (the customer authenticated it
// on-session) or is processing is recorded as the key's charge instead of
// charging again. done=false means: go on with attempt n.
func (p *Processor) closePreviousAttempt(ctx context.Context, h *hold, rec ledger.Record, log *slog.Logger) (Outcome, bool, error) {
	if rec.Attempt <= 1 || rec.PaymentIntentID == "" {
		return "", false, nil
	}
	it, err := p.cfg.Stripe.GetIntent(ctx, rec.PaymentIntentID)
	if err == nil && it.Open() {
		it, err = p.cfg.Stripe.CancelIntent(ctx, rec.PaymentIntentID, "pelguard-cancel-"+rec.PaymentIntentID)
	}
	if err != nil {
		res, err := p.release(ctx, rec, OutcomeRetryLater, fmt.Errorf("closing attempt %d's payment intent %s: %w", rec.Attempt-1, rec.PaymentIntentID, err))
		return res, true, err
	}
	switch it.Status {
	case "canceled":
		return "", false, nil
	case "succeeded", "processing":
		if it.LatestChargeID != "" {
			log.InfoContext(ctx, "the previous attempt's intent moved money after all; recording it",
				slog.String("payment_intent", it.ID), slog.String("status", it.Status))
			status := "succeeded"
			if it.Status == "processing" {
				status = "pending"
			}
			res, err := p.recordFound(ctx, h, rec, stripeapi.Charge{ID: it.LatestChargeID, PaymentIntentID: it.ID, Status: status})
			return res, true, err
		}
	}
	res, err := p.release(ctx, rec, OutcomeRetryLater, fmt.Errorf("attempt %d's payment intent %s is %s and could not be cancelled", rec.Attempt-1, it.ID, it.Status))
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
		due, ok, err := p.cfg.ledger.TakeDue(ctx, p.cfg.Name, p.cfg.Lease, p.cfg.DeclineRetryAfter, p.cfg.RequireCap)
		if err != nil {
			return res, err
		}
		if !ok {
			break
		}
		if due.CapErr != nil {
			res.CapBlocked++
			r := due.Record
			var ce *ledger.CapError
			if errors.As(due.CapErr, &ce) {
				p.cfg.Notifier.Notify(alerts.SpendCapReached(r.BillingPeriod, ce.CapCents, ce.ReservedCents, ce.RequestedCents, r.CustomerID))
			}
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
	_, settled, err := settleCharge(ctx, p.cfg.ledger, p.cfg.Notifier, p.cfg.retryPolicy(), rec, ch.Status, ch.FailureCode, ch.FailureMessage)
	return settled, err
}

// settleCharge applies Stripe's status of a processing row's charge
// (polled, or from a webhook): succeeded → charged; failed → declined, with
// a retry under the next attempt's key when the failure code allows a
// re-presentment and the policy has one left (else one alert); pending →
// nothing. A row that is no longer waiting for that charge is left alone.
func settleCharge(ctx context.Context, l *ledger.Ledger, n alerts.Notifier, policy RetryPolicy, rec ledger.Record,
	status, failureCode, failureMessage string) (ledger.Record, bool, error) {
	s := ledger.Settlement{ChargeID: rec.ChargeID, FailureCode: failureCode, Error: failureMessage}
	switch status {
	case "succeeded":
		s.Succeeded = true
	case "failed":
		if stripeapi.DebitRetryable(failureCode) {
			s.RetryAt = policy.retryAt(l.Now(), rec.Attempt, true)
		}
	default:
		return rec, false, nil
	}
	r, err := l.Settle(ctx, rec.Key, s)
	if errors.Is(err, ledger.ErrNotInMotion) {
		return rec, false, nil
	}
	if err != nil {
		return rec, false, err
	}
	if !s.Succeeded && s.RetryAt.IsZero() {
		n.Notify(alerts.ChargeDeclined(alerts.Decline{CustomerID: rec.CustomerID, Period: rec.BillingPeriod,
			Code: failureCode, Hard: !stripeapi.DebitRetryable(failureCode), Debit: true, Attempt: rec.Attempt}))
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
