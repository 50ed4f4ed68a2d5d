// Package startstop is the one start/stop contract of pelguard's background
// loops (STYLE.md, after River's rivershared/startstop): Start once; Stop is
// idempotent and safe before Start; Start after Stop is refused. The work
// gets two contexts: loopCtx ends when Stop is called (stop taking new work),
// workCtx only when Stop's own deadline passes (work in progress — a Stripe
// call whose outcome must be recorded — is otherwise allowed to finish).
package startstop

import (
	"context"
	"errors"
	"sync"
)

// Errors returned by Start.
var (
	ErrAlreadyStarted = errors.New("already started")
	ErrStopped        = errors.New("stopped")
)

// Service runs one loop under the contract. The zero value is ready to use.
type Service struct {
	mu         sync.Mutex
	started    bool
	stopped    bool
	stopLoop   context.CancelFunc
	cancelWork context.CancelFunc
	done       chan struct{}
	err        error
}

// Start runs run(loopCtx, workCtx) in a goroutine. Both contexts are
// detached from ctx's cancellation: only Stop ends them.
func (s *Service) Start(ctx context.Context, run func(loopCtx, workCtx context.Context) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.stopped: // checked first: after Stop, a Start is refused as stopped
		return ErrStopped
	case s.started:
		return ErrAlreadyStarted
	}
	s.started = true
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	loopCtx, stopLoop := context.WithCancel(workCtx)
	s.stopLoop, s.cancelWork = stopLoop, cancelWork
	done := s.doneLocked()
	go func() {
		defer close(done)
		err := run(loopCtx, workCtx)
		if errors.Is(err, context.Canceled) {
			err = nil
		}
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
	}()
	return nil
}

// Stop ends the loop and waits for run to return. If ctx ends first, work in
// progress is cancelled, Stop still waits for run to return, and ctx's error
// is returned; otherwise run's error. Stop is idempotent and safe before Start.
func (s *Service) Stop(ctx context.Context) error {
	s.mu.Lock()
	s.stopped = true
	started := s.started
	done := s.doneLocked()
	s.mu.Unlock()
	if !started {
		return nil
	}
	s.stopLoop()
	select {
	case <-done:
		s.cancelWork()
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.err
	case <-ctx.Done():
		s.cancelWork()
		<-done
		return ctx.Err()
	}
}

// Done is closed when run has returned.
func (s *Service) Done() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.doneLocked()
}

func (s *Service) doneLocked() chan struct{} {
	if s.done == nil {
		s.done = make(chan struct{})
	}
	return s.done
}
