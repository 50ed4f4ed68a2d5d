// Package clock is the injected time source of every pelguard service, so
// that tests move time forward instead of sleeping (lease expiry, the 23 h
// safe key window, audit windows).
package clock

import (
	"sync"
	"time"
)

// Clock tells the time.
type Clock interface {
	Now() time.Time
}

// Real is the wall clock.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// Sim is a clock that tests control. The zero value is not usable: use NewSim.
// It starts at the given time and moves only when Advance or Set is called,
// or, if created with NewSimFollowing, with the wall clock plus an offset.
type Sim struct {
	mu     sync.Mutex
	now    time.Time
	offset time.Duration
	follow bool
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
	if s.follow {
		return time.Now().Add(s.offset)
	}
	return s.now
}

// Advance moves the clock forward by d.
func (s *Sim) Advance(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = s.now.Add(d)
	s.offset += d
}

// Set moves the clock to t (frozen clocks only).
func (s *Sim) Set(t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = t
}

// Or returns c, or the real clock when c is nil.
func Or(c Clock) Clock {
	if c == nil {
		return Real{}
	}
	return c
}
