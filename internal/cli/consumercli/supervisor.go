package consumercli

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/cli"
)

// supervisor runs one consumer per stream in one process. They stop
// together: when ctx ends (SIGTERM), or when any of them ends by itself (a
// fatal error), so a process never keeps consuming some of its streams
// while silently dropping another.
type supervisor struct {
	consumers       []*consumer.Consumer
	streams         []cli.StreamGroup // of each consumer, for the logs
	shutdownTimeout time.Duration
	logger          *slog.Logger
	workers         int   // for the start log line
	count           int64 // for the start log line

	ended chan struct{} // one value per consumer that has ended
}

// start starts every consumer. One that fails to start stops the ones
// already started, and its error is returned.
func (s *supervisor) start(ctx context.Context) error {
	s.ended = make(chan struct{}, len(s.consumers))
	for i, c := range s.consumers {
		// Start detaches the consumer from ctx: only stop ends it, so the
		// events in flight at SIGTERM can finish.
		if err := c.Start(ctx); err != nil {
			stopAll(s.consumers[:i], s.shutdownTimeout, s.logger)
			return err
		}
		go func() { <-c.Done(); s.ended <- struct{}{} }()
		s.logger.Info("consumer started", "name", c.Name(), "stream", s.streams[i].Stream, "group", s.streams[i].Group,
			"workers", s.workers, "count", s.count)
	}
	return nil
}

// wait returns when ctx ends or one consumer ended by itself.
func (s *supervisor) wait(ctx context.Context) {
	select {
	case <-ctx.Done():
		s.logger.Info("stopping: finishing events in flight", "timeout", s.shutdownTimeout)
	case <-s.ended:
	}
}

// stop stops every consumer; false when any stopped with events unfinished.
func (s *supervisor) stop() bool { return stopAll(s.consumers, s.shutdownTimeout, s.logger) }

// stopAll stops the consumers at once, sharing one timeout; false when any
// stopped with events unfinished (they stay pending: safe to redeliver).
func stopAll(cs []*consumer.Consumer, timeout time.Duration, logger *slog.Logger) bool {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var (
		wg    sync.WaitGroup
		clean atomic.Bool
	)
	clean.Store(true)
	for _, c := range cs {
		wg.Go(func() {
			if err := c.Stop(ctx); err != nil {
				clean.Store(false)
				logger.Error("stopped with events unfinished; they stay pending and are safe to redeliver",
					"stream", c.Stream(), "error", err)
			}
		})
	}
	wg.Wait()
	return clean.Load()
}
