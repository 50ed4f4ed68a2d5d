package audit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/robfig/cron/v3"
)

// Scheduler runs the Auditor on a cron schedule (robfig/cron/v3): a run
// still going when the next is due makes that one skip, a panic in a run is
// recovered and logged, and Stop waits for a run in progress.
type Scheduler struct {
	a        *Auditor
	spec     string
	onReport func(Report, error)

	mu      sync.Mutex
	c       *cron.Cron
	cancel  context.CancelFunc
	started bool
	stopped bool
}

// ErrStopped is returned by Start after Stop.
var ErrStopped = errors.New("audit scheduler stopped")

// NewScheduler parses spec (five fields, or a descriptor such as
// "@hourly" or "@every 15m"). onReport, if set, receives every run's
// outcome (ErrLocked when another process was running).
func (a *Auditor) NewScheduler(spec string, onReport func(Report, error)) (*Scheduler, error) {
	if _, err := cron.ParseStandard(spec); err != nil {
		return nil, fmt.Errorf("schedule %q: %w", spec, err)
	}
	return &Scheduler{a: a, spec: spec, onReport: onReport}, nil
}

// Start begins scheduling. Runs get a context derived from ctx that Stop
// cancels only when its own deadline passes, so SIGTERM (which ends the
// caller's signal context, not ctx) lets a run finish. Starting twice is a
// no-op.
func (s *Scheduler) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return ErrStopped
	}
	if s.started {
		return nil
	}
	runCtx, cancel := context.WithCancel(ctx)
	logger := cronLogger{s.a.log}
	c := cron.New(cron.WithLogger(logger), cron.WithChain(cron.Recover(logger), cron.SkipIfStillRunning(logger)))
	if _, err := c.AddFunc(s.spec, func() { s.runOnce(runCtx) }); err != nil {
		cancel()
		return fmt.Errorf("schedule %q: %w", s.spec, err)
	}
	s.c, s.cancel, s.started = c, cancel, true
	c.Start()
	s.a.log.Info("audit scheduler started", slog.String("schedule", s.spec))
	return nil
}

// runOnce is one scheduled run; tests call it directly.
func (s *Scheduler) runOnce(ctx context.Context) {
	rep, err := s.a.Run(ctx, Window{})
	switch {
	case errors.Is(err, ErrLocked):
		s.a.log.Info("scheduled audit skipped: another run holds the lock")
	case errors.Is(err, ErrEmptyWindow):
		s.a.log.Info("scheduled audit skipped: nothing new to audit yet")
	case err != nil:
		s.a.log.Error("scheduled audit failed", slog.Any("error", err))
	}
	if s.onReport != nil {
		s.onReport(rep, err)
	}
}

// Stop stops scheduling and waits for a run in progress; when ctx ends
// first, the run is cancelled and Stop returns ctx's error. Stopping twice,
// or before Start, is safe.
func (s *Scheduler) Stop(ctx context.Context) error {
	s.mu.Lock()
	s.stopped = true
	c, cancel := s.c, s.cancel
	s.c = nil
	s.mu.Unlock()
	if c == nil {
		return nil
	}
	done := c.Stop().Done()
	defer cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		cancel()
		<-done
		return fmt.Errorf("waiting for the audit run in progress: %w", ctx.Err())
	}
}

// cronLogger adapts cron's logr-style logger to slog.
type cronLogger struct{ l *slog.Logger }

func (c cronLogger) Info(msg string, kv ...any) {
	// cron reports every wake-up at Info; only a skipped run is news.
	if msg == "skip" {
		c.l.Info("cron: run skipped, the previous one is still running", kv...)
		return
	}
	c.l.Debug("cron: "+msg, kv...)
}

func (c cronLogger) Error(err error, msg string, kv ...any) {
	c.l.Error("cron: "+msg, append(kv, slog.Any("error", err))...)
}
