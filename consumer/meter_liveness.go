package consumer

import (
	"context"
	"time"
)

// A running meter consumer registers in its group's liveness registry and
// publishes its Stats every Lease/3, as a billing consumer's heartbeat
// does: the console's consumers panel then shows it live, with its rate,
// and the reaper's hygiene forgets it once it has been silent for
// --consumer-idle. (The reaper's meter decisions read the meter ledger's
// leases, not the registry: this changes none of them.)

// beatWhileRunning registers now and every Lease/3 until the returned
// function is called, which waits for the last beat to end.
func (c *MeterConsumer) beatWhileRunning(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.register(ctx)
		t := time.NewTicker(max(c.cfg.Lease/3, 10*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				c.register(ctx)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// register refreshes the liveness entry and the published Stats; a failure
// is logged (the panel shows the consumer silent a little early).
func (c *MeterConsumer) register(ctx context.Context) {
	now := c.cfg.Clock.Now()
	if err := registerWithStats(ctx, c.cfg.Redis, c.cfg.Stream, c.cfg.Group, c.cfg.Name, now, c.live.stats(now)); err != nil && ctx.Err() == nil {
		c.cfg.Logger.Warn("meter consumer: registering liveness failed", "stream", c.cfg.Stream, "err", err)
	}
}
