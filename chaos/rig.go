package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/naive"
	"github.com/pelguard/pelguard/reaper"
	"github.com/pelguard/pelguard/stripeapi"
)

// namespace is the drill's idempotency-key namespace.
const namespace = "chaos"

// lease is pelguard's ledger lease for a min-idle: its heartbeat (every
// lease/3) must renew a live consumer's PEL entry well before the reaper
// could see it idle.
func lease(minIdle time.Duration) time.Duration {
	return max(300*time.Millisecond, 3*minIdle/2)
}

// rig runs a mode's components in the background until stop.
type rig struct {
	// stopping ends the naive loops between iterations; the work itself
	// runs on the caller's context, so a Stripe call in flight completes
	// and is counted, as it would be in a process that is not killed.
	stopping chan struct{}
	wg       sync.WaitGroup
	stops    []func(context.Context) error
}

func newRig() *rig { return &rig{stopping: make(chan struct{})} }

// loop calls once until stop, pausing every between calls.
func (r *rig) loop(ctx context.Context, every time.Duration, once func(context.Context) error, log *slog.Logger) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			select {
			case <-r.stopping:
				return
			case <-ctx.Done():
				return
			default:
			}
			pause := every
			if err := once(ctx); err != nil && ctx.Err() == nil {
				// The seed's loop would die here; the drill keeps going,
				// which leaves the entries pending exactly as a crash would.
				log.Debug("chaos: naive loop error, entries stay pending", slog.Any("error", err))
				pause = max(pause, 100*time.Millisecond)
			}
			if pause > 0 {
				select {
				case <-r.stopping:
					return
				case <-ctx.Done():
					return
				case <-time.After(pause):
				}
			}
		}
	}()
}

// stop stops everything and waits for it: pelguard's components finish the
// events in flight (their Stripe calls are recorded), the naive loops finish
// their current batch.
func (r *rig) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var firstErr error
	for _, s := range r.stops {
		if err := s(ctx); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	close(r.stopping)
	r.wg.Wait()
	return firstErr
}

// runNaive runs the seed's `while True:` read loop of nc (its RunOnce: one
// XREADGROUP and the batch it returns) until stop.
func (r *rig) runNaive(ctx context.Context, nc *naive.Consumer, log *slog.Logger) {
	r.loop(ctx, 0, func(ctx context.Context) error { _, err := nc.RunOnce(ctx); return err }, log)
}

// naiveConsumer is the seed's consumer on the cell's stream.
func (c *cell) naiveConsumer(name string, count int64, deferAck bool, sc *stripeapi.Client) (*naive.Consumer, error) {
	return naive.NewConsumer(naive.ConsumerConfig{
		Redis: c.rdb, Stream: c.stream, Group: c.group, Name: name, Count: count,
		Block: 50 * time.Millisecond, Stripe: sc, DeferAck: deferAck, Logger: c.log,
	})
}

// startNaive runs the given naive consumers and the seed's XAUTOCLAIM
// monitor, which hands what it reclaims to "consumer-B" to charge again.
func (c *cell) startNaive(ctx context.Context, consumers ...*naive.Consumer) (*rig, error) {
	plain, err := c.stripe(stripeapi.ModeCharges, nil)
	if err != nil {
		return nil, err
	}
	b, err := c.naiveConsumer("consumer-B", 10, false, plain)
	if err != nil {
		return nil, err
	}
	mon, err := naive.NewMonitor(naive.MonitorConfig{
		Redis: c.rdb, Stream: c.stream, Group: c.group, Consumer: "consumer-B",
		MinIdle: c.d.cfg.MinIdle, Handler: b.ProcessClaimed, Logger: c.log,
	})
	if err != nil {
		return nil, err
	}
	r := newRig()
	for _, nc := range consumers {
		r.runNaive(ctx, nc, c.log)
	}
	r.loop(ctx, 50*time.Millisecond, func(ctx context.Context) error { _, err := mon.RunOnce(ctx); return err }, c.log)
	return r, nil
}

// pelguardConfig is the consumer configuration every pelguard component of
// a cell shares (the namespace above all: it is in the idempotency key).
func (c *cell) pelguardConfig(name string, sc consumer.Stripe) consumer.Config {
	return consumer.Config{
		Redis: c.rdb, DB: c.pool, Schema: c.schema, Stripe: sc, Stream: c.stream, Group: c.group,
		Name: name, Namespace: namespace, Count: 10, Block: 50 * time.Millisecond, Workers: 4,
		Lease: lease(c.d.cfg.MinIdle), Logger: c.log, Clock: c.clk,
	}
}

// startPelguard runs a pelguard consumer (name "" is a unique one) with sc,
// and the reaper in place of the naive monitor, re-driving with a Stripe
// client of its own.
func (c *cell) startPelguard(ctx context.Context, name string, sc consumer.Stripe) (*rig, error) {
	cons, err := consumer.New(c.pelguardConfig(name, sc))
	if err != nil {
		return nil, fmt.Errorf("building the consumer: %w", err)
	}
	plain, err := c.stripe(stripeapi.ModePaymentIntents, nil)
	if err != nil {
		return nil, err
	}
	rp, err := reaper.New(reaper.Config{
		Redis: c.rdb, DB: c.pool, Schema: c.schema, Stripe: plain,
		Streams: []reaper.StreamGroup{{Stream: c.stream, Group: c.group}},
		MinIdle: c.d.cfg.MinIdle, Interval: 50 * time.Millisecond, Namespace: namespace,
		Lease: lease(c.d.cfg.MinIdle), ConsumerIdle: -1, Logger: c.log, Clock: c.clk,
	})
	if err != nil {
		return nil, fmt.Errorf("building the reaper: %w", err)
	}
	r := newRig()
	if err := cons.Start(ctx); err != nil {
		return nil, fmt.Errorf("starting the consumer: %w", err)
	}
	r.stops = append(r.stops, cons.Stop)
	if err := rp.Start(ctx); err != nil {
		_ = cons.Stop(context.Background())
		return nil, fmt.Errorf("starting the reaper: %w", err)
	}
	r.stops = append(r.stops, rp.Stop)
	return r, nil
}

// readAll delivers up to n new entries to name without processing them, as
// XREADGROUP does for a consumer that then works through its batch.
func (c *cell) readAll(ctx context.Context, name string, n int64) ([]redis.XMessage, error) {
	// As a pelguard consumer would, name registers first (the naive
	// monitor ignores it; pelguard's reaper leaves unregistered owners alone).
	if err := consumer.Register(ctx, c.rdb, c.stream, c.group, name, c.clk.Now()); err != nil {
		return nil, err
	}
	res, err := c.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: c.group, Consumer: name,
		Streams: []string{c.stream, ">"}, Count: n, Block: -1}).Result()
	if err != nil {
		return nil, fmt.Errorf("XREADGROUP for %s: %w", name, err)
	}
	if len(res) == 0 {
		return nil, nil
	}
	return res[0].Messages, nil
}
