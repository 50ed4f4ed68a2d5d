// Package clock is the injected time source of every pelguard service and of
// the Stripe emulator, so that tests move time forward instead of sleeping
// (lease expiry, the 23 h safe key window, audit windows, alert backoffs).
//
// Every public Config that reads the time takes a Clock; nil means the wall
// clock.
package clock

import (
	"sync"
	"time"
)

// Clock tells the time.
type Clock interface {
	Now() time.Time
}

// Waiter is a Clock that also schedules wake-ups. Code that waits (backoffs,
// Retry-After, a flush interval) calls After, which uses the clock's own
// After when it has one, so a simulated clock controls waits as well as
// "now".
type Waiter interface {
	Clock
	// After behaves like time.After: the channel receives once d has passed
	// on this clock.
	After(d time.Duration) <-chan time.Time
}

// After waits d on c: c's own After when c is a Waiter, time.After otherwise.
func After(c Clock, d time.Duration) <-chan time.Time {
	if w, ok := c.(Waiter); ok {
		return w.After(d)
	}
	return time.After(d)
}

// Real is the wall clock.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// After returns time.After(d).
func (Real) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Or returns c, or the real clock when c is nil.
func Or(c Clock) Clock {
	if c == nil {
		return Real{}
	}
	return c
}

// Sim is a clock that tests control. Use NewSim (frozen: it moves only
// through Advance and Set) or NewSimFollowing (the wall clock plus an offset
// that Advance and Set move).
//
// After on a frozen Sim fires when Advance or Set moves the clock past the
// deadline; on a following Sim it fires after the wall-clock remainder, and
// at once when Advance jumps past it.
type Sim struct {
	mu      sync.Mutex
	now     time.Time     // frozen clocks
	offset  time.Duration // following clocks
	follow  bool
	waiters []simWaiter
}

type simWaiter struct {
	at time.Time
	ch chan time.Time
}

// NewSim returns a clock frozen at t.
func NewSim(t time.Time) *Sim { return &Sim{now: t} }

// NewSimFollowing returns a clock that follows the wall clock and can be
// pushed forward with Advance: useful where real timeouts must still fire.
func NewSimFollowing() *Sim { return &Sim{follow: true} }

// Now returns the simulated time.
func (s *Sim) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nowLocked()
}

func (s *Sim) nowLocked() time.Time {
	if s.follow {
		return time.Now().Add(s.offset)
	}
	return s.now
}

// Advance moves the clock forward by d.
func (s *Sim) Advance(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.follow {
		s.offset += d
	} else {
		s.now = s.now.Add(d)
	}
	s.fireLocked()
}

// Set moves the clock to t (a following clock: its offset becomes t minus
// the wall clock).
func (s *Sim) Set(t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.follow {
		s.offset = time.Until(t)
	} else {
		s.now = t
	}
	s.fireLocked()
}

// After returns a channel that receives once d has passed on this clock.
func (s *Sim) After(d time.Duration) <-chan time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan time.Time, 1)
	now := s.nowLocked()
	if d <= 0 {
		ch <- now
		return ch
	}
	at := now.Add(d)
	s.waiters = append(s.waiters, simWaiter{at: at, ch: ch})
	if s.follow {
		// Wall time moves a following clock too: wake up when it would.
		time.AfterFunc(d, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.fireLocked()
		})
	}
	return ch
}

// Waiters is how many After channels have not fired yet: a test waits for
// its code to be blocked on the clock before advancing it.
func (s *Sim) Waiters() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiters)
}

func (s *Sim) fireLocked() {
	now := s.nowLocked()
	kept := s.waiters[:0]
	for _, w := range s.waiters {
		if !now.Before(w.at) {
			w.ch <- now
			continue
		}
		kept = append(kept, w)
	}
	s.waiters = kept
}
