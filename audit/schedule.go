package audit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/robfig/cron/v3"

	"github.com/pelguard/pelguard/internal/startstop"
)

// Scheduler runs the Auditor on a cron schedule (robfig/cron/v3): a run
// still going when the next is due makes that one skip, a panic in a run is
// recovered and logged, and Stop waits for a run in progress. It keeps the
// start/stop contract of the consumer and the reaper (internal/startstop).
type Scheduler struct {
	a        *Auditor
	spec     string
	onReport func(Report, error)
	onUsage  func(UsageReport, error)

	svc startstop.Service
}

// Errors from Start (the shared start/stop contract).
var (
	ErrAlreadyStarted = startstop.ErrAlreadyStarted
	ErrStopped        = startstop.ErrStopped
)

// NewScheduler parses spec (five fields, or a descriptor such as
// "@hourly" or "@every 15m"). onReport, if set, receives every run's
// outcome (ErrLocked when another process was running).
func (a *Auditor) NewScheduler(spec string, onReport func(Report, error)) (*Scheduler, error) {
	if _, err := cron.ParseStandard(spec); err != nil {
		return nil, fmt.Errorf("schedule %q: %w", spec, err)
	}
	return &Scheduler{a: a, spec: spec, onReport: onReport}, nil
}

// Start begins scheduling in the background. Runs get a context that Stop
// cancels only when its own deadline passes, so SIGTERM lets a run finish.
// A second Start returns ErrAlreadyStarted; Start after Stop, ErrStopped.
func (s *Scheduler) Start(ctx context.Context) error {
	return s.svc.Start(ctx, s.run)
}

func (s *Scheduler) run(loopCtx, workCtx context.Context) error {
	logger := cronLogger{s.a.log}
	c := cron.New(cron.WithLogger(logger), cron.WithChain(cron.Recover(logger), cron.SkipIfStillRunning(logger)))
	if _, err := c.AddFunc(s.spec, func() { s.runOnce(workCtx) }); err != nil {
		return fmt.Errorf("schedule %q: %w", s.spec, err)
	}
	c.Start()
	s.a.log.Info("audit scheduler started", slog.String("schedule", s.spec))
	<-loopCtx.Done()
	// cron's Stop waits for the run in progress; Stop's deadline ends
	// workCtx, which cancels that run.
	<-c.Stop().Done()
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
	if !s.a.cfg.Usage.Enabled || ctx.Err() != nil {
		return
	}
	// The usage reconciliation follows the charges' audit, under a lock of
	// its own: a failed charge audit does not keep meters from being read.
	urep, err := s.a.ReconcileUsage(ctx)
	switch {
	case errors.Is(err, ErrLocked):
		s.a.log.Info("scheduled usage reconciliation skipped: another run holds the lock")
	case errors.Is(err, ErrUsageSpan):
		s.a.log.Info("scheduled usage reconciliation skipped: no settled window yet")
	case err != nil:
		s.a.log.Error("scheduled usage reconciliation failed", slog.Any("error", err))
	}
	if s.onUsage != nil {
		s.onUsage(urep, err)
	}
}

// OnUsage sets what receives every scheduled usage reconciliation's outcome
// (Config.Usage.Enabled); call it before Start.
func (s *Scheduler) OnUsage(f func(UsageReport, error)) { s.onUsage = f }

// Stop stops scheduling and waits for a run in progress; when ctx ends
// first, the run is cancelled and Stop returns ctx's error. Stopping twice,
// or before Start, is safe.
func (s *Scheduler) Stop(ctx context.Context) error { return s.svc.Stop(ctx) }

// Done is closed when the scheduler has stopped.
func (s *Scheduler) Done() <-chan struct{} { return s.svc.Done() }

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
