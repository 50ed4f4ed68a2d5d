package consumer

import (
	"cmp"
	"fmt"
	"time"

	"github.com/pelguard/pelguard/stripeapi"
)

// Retry defaults.
const (
	DefaultDeclineRetries    = 3
	DefaultDeclineRetryAfter = 24 * time.Hour
	// NoDeclineRetries turns retries of soft declines and failed debits off
	// (RetryPolicy.Retries; the CLI's --decline-retries 0).
	NoDeclineRetries = -1
	// MaxLedgerTakeovers is how many times the ledger's own retry loop takes
	// a ledger-driven row of one attempt over after its holder released it
	// (a transient failure, an earlier attempt's intent that cannot be
	// closed) before the row is parked with an alert. The takeovers wait 1
	// min, 2, 4, … up to 1 h apart (ledger.ReleasedRetryDelay), so the
	// budget lasts about five hours: a Stripe outage is ridden out, a 403
	// that never goes away reaches a person the same day.
	MaxLedgerTakeovers = 10
	// capBlockedRetryGap is how long a ledger retry the spend cap (or a
	// missing cap under RequireCap) holds back waits before it is tried
	// again: soon after an operator sets or raises the cap, not a day later.
	capBlockedRetryGap = time.Hour
)

// RetryPolicy is the fleet's one decline and bank-debit policy: whether and
// when a final failure of attempt n is tried again under attempt n+1's key.
// Every role that can record a decline uses the same one — the consumer,
// the reaper's re-drives and the webhook — and its zero value means the
// defaults in each of them (the CLIs set it from --decline-retries and
// --decline-retry-after, or PELGUARD_DECLINE_RETRIES and
// PELGUARD_DECLINE_RETRY_AFTER, shared by every role).
type RetryPolicy struct {
	// Retries is how many attempts may follow the first. 0 means
	// DefaultDeclineRetries; NoDeclineRetries means none. Bank debits are
	// re-presented at most stripeapi.MaxDebitRepresentments times whatever
	// it says.
	Retries int
	// After is the wait before each retry; 0 means DefaultDeclineRetryAfter.
	After time.Duration
}

// withDefaults resolves the zero values.
func (r RetryPolicy) withDefaults() RetryPolicy {
	r.Retries = cmp.Or(r.Retries, DefaultDeclineRetries)
	r.After = cmp.Or(r.After, DefaultDeclineRetryAfter)
	return r
}

// Validate reports a policy no role may run with, naming the flag to fix.
func (r RetryPolicy) Validate() error {
	r = r.withDefaults()
	switch {
	case r.Retries < NoDeclineRetries || r.Retries > 10:
		return fmt.Errorf("--decline-retries %d must be between 0 and 10", max(r.Retries, 0))
	case r.After < time.Minute:
		return fmt.Errorf("--decline-retry-after %s is too short (minimum 1m; card networks penalise rapid retries)", r.After)
	}
	return nil
}

// retryAt is when attempt+1 runs after attempt failed with a retryable
// code, or zero when no retry is left. r must have its defaults.
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
