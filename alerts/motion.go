package alerts

import (
	"fmt"

	"github.com/pelguard/pelguard/internal/cmdname"
)

// Kinds of the ledger's own retries (DESIGN.md invariant 10).
const (
	// KindRetryParked: the ledger stopped retrying a row by itself.
	KindRetryParked Kind = "retry_parked"
	// KindRetryBlocked: the spend cap (or a missing cap under
	// --require-cap) holds a ledger retry back.
	KindRetryBlocked Kind = "retry_blocked"
)

// RetryParked reports a row the ledger's retry loop gave up on after
// takeovers attempts that each ended with reason (an earlier attempt's
// payment intent that cannot be closed, a Stripe error that does not go
// away). The customer is not billed for the period, and nothing records a
// charge or a failure by guess: a person looks at Stripe, then runs
// `consumer retry`.
func RetryParked(customerID, period string, attempt, takeovers int, reason string) Alert {
	return Alert{
		Kind:  KindRetryParked,
		Title: "Retry parked: " + customerID + " " + period,
		Text: fmt.Sprintf("Customer %s is *not billed* for %s: attempt %d was tried %d times and failed each time: %s\n"+
			"The ledger stopped retrying it and reports it as stuck. Check the customer's payments at Stripe, fix the cause, "+
			"then `"+cmdname.Consumer+" retry --period %s --customer %s`.",
			code(customerID), code(period), attempt, takeovers, Escape(reason), period, customerID),
		Fields: []Field{
			{Label: "Customer", Value: customerID},
			{Label: "Period", Value: period},
			{Label: "Attempt", Value: fmt.Sprint(attempt)},
		},
		Fingerprint: "retry_parked:" + customerID + "\x00" + period,
	}
}

// RetryBlocked reports a ledger retry (a soft decline's, a failed debit's)
// that was not made because of the spend cap: detail says which rule. It is
// tried again every hour; repeats for the period are deduplicated.
func RetryBlocked(customerID, period, detail string) Alert {
	return Alert{
		Kind:  KindRetryBlocked,
		Title: "Retry held back by the spend cap for " + period,
		Text: fmt.Sprintf("The retry of customer %s for %s was *not made*: %s\n"+
			"It is tried again every hour: set or raise the cap (`"+cmdname.Consumer+" cap set --period %s …`).",
			code(customerID), code(period), Escape(detail), period),
		Fields: []Field{
			{Label: "Customer", Value: customerID},
			{Label: "Period", Value: period},
		},
		Fingerprint: "retry_blocked:" + period,
	}
}
