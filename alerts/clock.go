package alerts

import "time"

// Clock is the time source of the notifiers and the dead-letter aggregator.
// It is injected so that tests advance time instead of sleeping through
// backoffs, Retry-After waits and the per-channel rate limit.
type Clock interface {
	Now() time.Time
	// After behaves like time.After: the channel receives once d has passed.
	After(d time.Duration) <-chan time.Time
}

// realClock is the wall clock used when Config.Clock is nil.
type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
