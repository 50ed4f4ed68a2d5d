package consumercli

import (
	"flag"
	"time"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/cli"
)

// Retries are the flags that decide what happens after a decline or a
// failed bank debit: shared by `consumer run` and `consumer webhook`, which
// must decide alike.
type Retries struct {
	DeclineRetries    int
	DeclineRetryAfter time.Duration
}

func (r *Retries) register(fs *flag.FlagSet) {
	fs.IntVar(&r.DeclineRetries, "decline-retries", consumer.DefaultDeclineRetries,
		"charge a soft decline (insufficient_funds, do_not_honor, try_again_later, …) again up to this many times, each under a new\n"+
			"attempt's key; failed bank debits with insufficient_funds are re-presented at most 2 times (NACHA); 0: never retry")
	fs.DurationVar(&r.DeclineRetryAfter, "decline-retry-after", consumer.DefaultDeclineRetryAfter, "wait between a decline and its retry (minimum 1m)")
}

func (r *Retries) validate() error {
	switch {
	case r.DeclineRetries < 0 || r.DeclineRetries > 10:
		return cli.Usagef("--decline-retries %d must be between 0 (no retries) and 10", r.DeclineRetries)
	case r.DeclineRetryAfter < time.Minute:
		return cli.Usagef("--decline-retry-after %s is too short: at least 1m (card networks penalise rapid retries; a day is usual)", r.DeclineRetryAfter)
	}
	return nil
}

// configValue is DeclineRetries as consumer.Config takes it (0 = default).
func (r *Retries) configValue() int {
	if r.DeclineRetries == 0 {
		return consumer.NoDeclineRetries
	}
	return r.DeclineRetries
}

func (r *Retries) policy() consumer.RetryPolicy {
	return consumer.RetryPolicy{Retries: r.DeclineRetries, After: r.DeclineRetryAfter}
}
