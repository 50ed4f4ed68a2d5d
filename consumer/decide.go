package consumer

import (
	"errors"
	"fmt"
	"time"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/stripeapi"
)

// The consumer's outcomes as a table. What each Stripe answer does to the
// ledger row, the stream entry and the alerts is decided here, by pure
// functions of (row, Stripe's answer, policy, now) that decide_test.go
// tests case by case, the way the reaper's decideEntry is. process.go,
// motion.go and webhook.go only do the I/O a verdict names, always in one
// order (apply): the fenced ledger write first, then the alert, then the
// ack or the dead letter (invariant 3).

// ledgerStep is what a verdict does to the ledger row.
type ledgerStep uint8

const (
	// writeOutcome records verdict.Record (ledger.Finish, fenced).
	writeOutcome ledgerStep = iota
	// releaseLease gives the lease up; the row stays pending, and the next
	// delivery (or TakeDue, for a ledger-driven row) takes it over under
	// the same attempt's key.
	releaseLease
	// parkRow stops the ledger's own retries of a ledger-driven row whose
	// takeover budget ran out: still pending, still unbilled, reported as
	// stuck until a person runs `consumer retry`.
	parkRow
	// lookUp: the answer cannot be decided without asking Stripe which
	// charge the key already made (idempotency_error).
	lookUp
)

// streamStep is what a verdict does to the stream entry.
type streamStep uint8

const (
	ackEntry streamStep = iota
	deadLetterEntry
	// leaveEntry leaves it pending (in the PEL; a ledger-driven row waits
	// for TakeDue).
	leaveEntry
)

// verdict is one decision: a ledger step, an alert, a stream step.
type verdict struct {
	Outcome Outcome
	Ledger  ledgerStep
	Record  ledger.Outcome // writeOutcome
	Stream  streamStep
	// Reason and Detail name the dead letter (deadLetterEntry).
	Reason, Detail string
	// Alert is sent once the ledger step is done.
	Alert *alerts.Alert
	// Cause is why the lease was released or the row parked; with
	// leaveEntry it is also the error returned with the outcome.
	Cause error
	// Note is an info log line worth writing.
	Note string
}

// chargeResult is Stripe's answer to one charge call.
type chargeResult struct {
	Charge stripeapi.Charge // when Err is nil
	Err    error
	// LeaseLost: the call was cut short because our lease went to
	// someone else (the event's context was cancelled with errLeaseLost).
	LeaseLost bool
}

// stripeRef is the adapter's typed error of err, or an empty one.
func stripeRef(err error) stripeapi.Error {
	var se *stripeapi.Error
	if errors.As(err, &se) {
		return *se
	}
	return stripeapi.Error{}
}

// found is the verdict for a charge Stripe made for the row's key (the
// call's answer, a look-up, an earlier attempt's intent that moved money):
// charged, or processing while it is a pending bank debit.
func found(ch stripeapi.Charge, now time.Time) verdict {
	if ch.Status == "pending" {
		return verdict{Outcome: OutcomeProcessing, Ledger: writeOutcome, Stream: ackEntry,
			Record: ledger.Outcome{Status: ledger.StatusProcessing, ChargeID: ch.ID, PaymentIntentID: ch.PaymentIntentID,
				PollAt: now.Add(pollMinGap)}}
	}
	return verdict{Outcome: OutcomeCharged, Ledger: writeOutcome, Stream: ackEntry,
		Record: ledger.Outcome{Status: ledger.StatusCharged, ChargeID: ch.ID}}
}

// release is the verdict that gives the lease up and leaves the entry.
func release(out Outcome, cause error) verdict {
	return verdict{Outcome: out, Ledger: releaseLease, Stream: leaveEntry, Cause: cause}
}

// decideCharge turns Stripe's answer to the row's charge call into a
// verdict. pol must have its defaults.
func decideCharge(rec ledger.Record, res chargeResult, pol RetryPolicy, now time.Time) verdict {
	err := res.Err
	se := stripeRef(err)
	switch {
	case err == nil:
		return found(res.Charge, now)
	case errors.Is(err, stripeapi.ErrCardDeclined):
		// A soft decline with retries left is retried by the ledger under
		// the next attempt's key (no alert); a hard one, or the last soft
		// one, is final and alerts once.
		// Stripe's advice_code and both forms of processing_error (the
		// error's code, or a card_declined's decline_code) decide the class.
		class := stripeapi.DeclineClassOf(err)
		v := verdict{Outcome: OutcomeDeclined, Ledger: writeOutcome, Stream: ackEntry,
			Record: ledger.Outcome{Status: ledger.StatusDeclined, Error: err.Error(), FailureCode: se.FailureCode(),
				PaymentIntentID: se.PaymentIntentID}}
		if class == stripeapi.DeclineSoft {
			v.Record.RetryAt = pol.retryAt(now, rec.Attempt, false)
		}
		if v.Record.RetryAt.IsZero() {
			a := alerts.ChargeDeclined(alerts.Decline{CustomerID: rec.CustomerID, Period: rec.BillingPeriod,
				Code: se.FailureCode(), Hard: class != stripeapi.DeclineSoft, Attempt: rec.Attempt})
			v.Alert = &a
		} else {
			v.Note = fmt.Sprintf("soft decline (%s): attempt %d is retried under the next attempt's key at %s",
				se.FailureCode(), rec.Attempt, v.Record.RetryAt.UTC().Format(time.RFC3339))
		}
		return v
	case errors.Is(err, stripeapi.ErrActionRequired):
		// Stripe cannot charge without the customer: recorded, alerted
		// naming what is needed, and parked for the replay that charges
		// again once it is fixed.
		a := alerts.ActionRequired(rec.CustomerID, rec.BillingPeriod, se.Message)
		return verdict{Outcome: OutcomeActionRequired, Ledger: writeOutcome, Stream: deadLetterEntry,
			Record: ledger.Outcome{Status: ledger.StatusActionRequired, Error: err.Error(), FailureCode: se.FailureCode(),
				PaymentIntentID: se.PaymentIntentID},
			Reason: ReasonActionRequired, Detail: se.Message, Alert: &a}
	case errors.Is(err, stripeapi.ErrTransient):
		if res.LeaseLost {
			return release(OutcomeLeaseLost, nil)
		}
		return release(OutcomeRetryLater, fmt.Errorf("stripe: %w", err))
	case errors.Is(err, stripeapi.ErrPermission), errors.Is(err, stripeapi.ErrAuthentication):
		// A key problem (403 names the missing permission, 401): nothing was
		// charged, and the event must stay chargeable once the key is fixed.
		// The row stays pending (lease released, cap still reserved), the
		// entry is parked in the dead-letter stream for replay instead of
		// being retried in a loop, and one alert per permission is sent
		// (deduplicated), not one per customer.
		a := alerts.StripeKeyRejected(err)
		return verdict{Outcome: OutcomeDeadLetter, Ledger: releaseLease, Stream: deadLetterEntry,
			Reason: ReasonStripeKey, Detail: err.Error(), Alert: &a, Cause: err}
	case errors.Is(err, stripeapi.ErrIdempotencyMismatch):
		// The key was first used with other parameters (a changed default
		// payment method, a config change between attempts). That first use
		// may have charged: the outcome is unknown, so look before deciding.
		return verdict{Ledger: lookUp, Cause: err}
	default:
		// Invalid request: Stripe refused it outright, nothing was charged
		// and retrying cannot help. Record it, park the event, tell a human.
		a := alerts.ChargeFailed(rec.CustomerID, rec.BillingPeriod, err.Error())
		return verdict{Outcome: OutcomeFailed, Ledger: writeOutcome, Stream: deadLetterEntry,
			Record: ledger.Outcome{Status: ledger.StatusFailed, Error: err.Error(), PaymentIntentID: se.PaymentIntentID},
			Reason: ReasonStripePerm, Detail: err.Error(), Alert: &a}
	}
}

// decideMismatch is the verdict after an idempotency_error's look-up:
// the charge the key already made is recorded; with none found, or a
// look-up that failed, the row stays pending and a human is told.
func decideMismatch(rec ledger.Record, ch stripeapi.Charge, ok bool, lookupErr, cause error, now time.Time) verdict {
	if lookupErr == nil && ok {
		v := found(ch, now)
		v.Note = "idempotency key reused with other parameters; recording the charge it already made: " + ch.ID
		return v
	}
	detail := "idempotency key reused with different parameters and no earlier charge found; it stays pending until the key expires at Stripe"
	if lookupErr != nil {
		detail = "idempotency key reused with different parameters, and looking for the earlier charge failed: " + lookupErr.Error()
	}
	a := alerts.ChargeFailed(rec.CustomerID, rec.BillingPeriod, detail)
	v := release(OutcomeRetryLater, fmt.Errorf("%s: %w", detail, cause))
	v.Alert = &a
	return v
}

// decidePrevious decides, before attempt n >= 2 calls Stripe, what attempt
// n-1's intent allows: it must never move money after attempt n is made.
// it is the intent as read (and cancelled when it was open), err the
// failure to read or cancel it. proceed: go on with attempt n.
func decidePrevious(rec ledger.Record, it stripeapi.Intent, err error, now time.Time) (v verdict, proceed bool) {
	if err != nil {
		return release(OutcomeRetryLater, fmt.Errorf("closing attempt %d's payment intent %s: %w",
			rec.Attempt-1, rec.PaymentIntentID, err)), false
	}
	switch it.Status {
	case "canceled":
		return verdict{}, true
	case "succeeded", "processing":
		// The customer authenticated it on-session, or a debit is on its
		// way: that is the key's charge, not a reason to charge again.
		if it.LatestChargeID != "" {
			status := "succeeded"
			if it.Status == "processing" {
				status = "pending"
			}
			v := found(stripeapi.Charge{ID: it.LatestChargeID, PaymentIntentID: it.ID, Status: status}, now)
			v.Note = fmt.Sprintf("the previous attempt's intent %s moved money after all (%s); recording it", it.ID, it.Status)
			return v, false
		}
	}
	return release(OutcomeRetryLater, fmt.Errorf("attempt %d's payment intent %s is %s and could not be cancelled",
		rec.Attempt-1, it.ID, it.Status)), false
}

// parkInstead turns the release of a ledger-driven row whose takeover
// budget ran out into parking it: the loop that TakeDue and a release
// that fails for good (an intent that answers 403, a processing intent
// without a charge) would otherwise make forever, refreshing the row so
// that nothing ever calls it stuck. Only the ledger's own retries are
// bounded here: a row with a stream entry is bounded by the reaper's
// maximum deliveries. A lost lease is someone else's row, not a failure.
func parkInstead(rec ledger.Record, ledgerDriven bool, v verdict) verdict {
	if !ledgerDriven || v.Ledger != releaseLease || v.Outcome != OutcomeRetryLater || rec.Redrives < MaxLedgerTakeovers {
		return v
	}
	reason := "released"
	if v.Cause != nil {
		reason = v.Cause.Error()
	}
	a := alerts.RetryParked(rec.CustomerID, rec.BillingPeriod, rec.Attempt, rec.Redrives+1, reason)
	v.Ledger, v.Alert = parkRow, &a
	v.Cause = fmt.Errorf("parked after %d tries of attempt %d: %s", rec.Redrives+1, rec.Attempt, reason)
	return v
}

// settlement is Stripe's final word on a processing row's pending charge
// turned into a ledger settlement and, for a failure that is not retried,
// its alert. final is false while the charge is still pending.
func decideSettlement(rec ledger.Record, status, failureCode, failureMessage string, pol RetryPolicy, now time.Time) (s ledger.Settlement, alert *alerts.Alert, final bool) {
	s = ledger.Settlement{ChargeID: rec.ChargeID, FailureCode: failureCode, Error: failureMessage}
	switch status {
	case "succeeded":
		s.Succeeded = true
		return s, nil, true
	case "failed":
		retryable := stripeapi.DebitRetryable(failureCode)
		if retryable {
			s.RetryAt = pol.retryAt(now, rec.Attempt, true)
		}
		if s.RetryAt.IsZero() {
			a := alerts.ChargeDeclined(alerts.Decline{CustomerID: rec.CustomerID, Period: rec.BillingPeriod,
				Code: failureCode, Hard: !retryable, Debit: true, Attempt: rec.Attempt})
			alert = &a
		}
		return s, alert, true
	}
	return s, nil, false
}

// decideCapBlocked is the alert for a ledger retry the spend cap held
// back: over the cap, or no cap under RequireCap.
func decideCapBlocked(rec ledger.Record, capErr error) alerts.Alert {
	var ce *ledger.CapError
	if errors.As(capErr, &ce) {
		return alerts.RetryBlocked(rec.CustomerID, rec.BillingPeriod, fmt.Sprintf("it would pass the cap (cap %s, reserved %s, requested %s)",
			alerts.Money(ce.CapCents, rec.Currency), alerts.Money(ce.ReservedCents, rec.Currency), alerts.Money(ce.RequestedCents, rec.Currency)))
	}
	return alerts.RetryBlocked(rec.CustomerID, rec.BillingPeriod, "the period has no spend cap and --require-cap is set")
}
