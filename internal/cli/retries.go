package cli

import (
	"flag"
	"time"

	"github.com/pelguard/pelguard/consumer"
)

// Retries are the flags of the fleet's one decline and bank-debit policy
// (consumer.RetryPolicy): what happens after a decline or a failed debit.
// Every role that can record one registers them — `consumer run`,
// `consumer webhook`, the reaper, whose re-drives charge too — with the
// same environment variables, so one ConfigMap sets the policy once for
// all of them.
type Retries struct {
	DeclineRetries    int
	DeclineRetryAfter time.Duration
}

// Register adds --decline-retries and --decline-retry-after.
func (r *Retries) Register(fs *flag.FlagSet) {
	fs.IntVar(&r.DeclineRetries, "decline-retries", EnvInt("PELGUARD_DECLINE_RETRIES", consumer.DefaultDeclineRetries),
		"charge a soft decline (insufficient_funds, do_not_honor, processing_error, …) again up to this many times, each under a new\n"+
			"attempt's key; failed bank debits with insufficient_funds are re-presented at most 2 times (NACHA); 0: never retry.\n"+
			"Give every role the same value [PELGUARD_DECLINE_RETRIES]")
	fs.DurationVar(&r.DeclineRetryAfter, "decline-retry-after", EnvDuration("PELGUARD_DECLINE_RETRY_AFTER", consumer.DefaultDeclineRetryAfter),
		"wait between a decline and its retry (minimum 1m) [PELGUARD_DECLINE_RETRY_AFTER]")
}

// Validate reports a value no role may run with, naming the fix.
func (r *Retries) Validate() error {
	switch {
	case r.DeclineRetries < 0 || r.DeclineRetries > 10:
		return Usagef("--decline-retries %d must be between 0 (no retries) and 10", r.DeclineRetries)
	case r.DeclineRetryAfter < time.Minute:
		return Usagef("--decline-retry-after %s is too short: at least 1m (card networks penalise rapid retries; a day is usual)", r.DeclineRetryAfter)
	}
	return nil
}

// Policy is the flags' policy as every role's Config takes it: the
// command line's 0 (never retry) is consumer.NoDeclineRetries there, where
// 0 means the default.
func (r *Retries) Policy() consumer.RetryPolicy {
	n := r.DeclineRetries
	if n == 0 {
		n = consumer.NoDeclineRetries
	}
	return consumer.RetryPolicy{Retries: n, After: r.DeclineRetryAfter}
}
