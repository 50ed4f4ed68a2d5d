package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/naive"
	"github.com/pelguard/pelguard/stripeapi"
)

// drain waits until the rig started by a scenario (or the error starting
// it) has worked off every entry, then stops it.
func (c *cell) drain(ctx context.Context, r *rig, err error) error {
	if err != nil {
		return err
	}
	werr := c.waitDrained(ctx)
	return errors.Join(werr, r.stop())
}

// phaseOneSettle is how long expired-key's first phase must stand still,
// with every lost entry pending, before the drill takes it as finished
// though an extra entry is pending too.
const phaseOneSettle = 3 * time.Second

// startPelguardWith starts pelguard (consumer + reaper) on payment intents
// with the scenario's faults.
func (c *cell) startPelguardWith(ctx context.Context, f http.RoundTripper) (*rig, error) {
	sc, err := c.stripe(stripeapi.ModePaymentIntents, f)
	if err != nil {
		return nil, err
	}
	return c.startPelguard(ctx, "", sc)
}

// inflightReclaim is failure mode 1, "reclaim while in flight": a tenth of
// the Stripe calls take three times the monitor's min-idle. The naive
// monitor's XAUTOCLAIM cannot tell slow from dead and consumer-B charges
// again; pelguard's heartbeat keeps renewing the entry, and the reaper
// checks the ledger lease before it would claim anything.
func inflightReclaim(ctx context.Context, c *cell) error {
	slow := &faults{slow: c.customers(c.pick(max(1, len(c.events)/10), 0, len(c.events))), delay: 3 * c.d.cfg.MinIdle}
	if _, err := c.publish(ctx); err != nil {
		return err
	}
	var r *rig
	var err error
	if c.mode == ModeNaive {
		sc, serr := c.stripe(stripeapi.ModeCharges, slow)
		if serr != nil {
			return serr
		}
		var workers []*naive.Consumer
		for i := range 4 {
			w, werr := c.naiveConsumer(fmt.Sprintf("worker-%d", i+1), 1, false, sc)
			if werr != nil {
				return werr
			}
			workers = append(workers, w)
		}
		r, err = c.startNaive(ctx, workers...)
	} else {
		r, err = c.startPelguardWith(ctx, slow)
	}
	return c.drain(ctx, r, err)
}

// partialBatch is failure mode 2, "partial batch", both halves. First a
// consumer process reads a COUNT 10 batch and is SIGKILLed right after
// Stripe's first reply, before anything is recorded or acked. Then a
// consumer reads COUNT 10 batches, and in half of them the 7th charge times
// out (committed at Stripe, reply lost). The naive consumer acks a batch
// only at its end, so the monitor reclaims whole batches and consumer-B
// charges 1–7 again, and the killed child's charge again; pelguard writes
// and acks per event, and the reaper re-drives the rest under the same
// idempotency key.
func partialBatch(ctx context.Context, c *cell) error {
	if _, err := c.publish(ctx); err != nil {
		return err
	}
	if err := c.runKilledChild(ctx); err != nil {
		return err
	}
	// The child took events 0–9; batches of 10 follow from event 10, so
	// the 7th of a batch is an event whose index ends in 6.
	batches := (len(c.events) - 10) / 10
	lose := map[int]bool{}
	for b := range c.pick(max(1, batches/2), 0, batches) {
		lose[10+10*b+6] = true
	}
	timeouts := &faults{lose: c.customers(lose), hang: 100 * time.Millisecond}
	var r *rig
	var err error
	if c.mode == ModeNaive {
		sc, serr := c.stripe(stripeapi.ModeCharges, timeouts)
		if serr != nil {
			return serr
		}
		a, aerr := c.naiveConsumer("worker-1", 10, true, sc)
		if aerr != nil {
			return aerr
		}
		r, err = c.startNaive(ctx, a)
	} else {
		r, err = c.startPelguardWith(ctx, timeouts)
	}
	return c.drain(ctx, r, err)
}

// expiredKey is a redelivery after Stripe's 24 h idempotency window: a fifth
// of the charges are committed at Stripe but their replies are lost, so the
// entries stay pending; a day and an hour pass (the emulator's clock and the
// ledger's move together) before the monitor, or the reaper, redelivers
// them. The naive code charges again; pelguard's takeover is past its safe
// key window, so it looks the charge up at Stripe and records it instead.
func expiredKey(ctx context.Context, c *cell) error {
	lost := c.pick(max(1, len(c.events)/5), 0, len(c.events))
	timeouts := &faults{lose: c.customers(lost), hang: 50 * time.Millisecond}
	if _, err := c.publish(ctx); err != nil {
		return err
	}
	// Phase 1: the consumer alone (no monitor, no reaper yet), so the lost
	// ones stay in the PEL, as a message stuck for a day does.
	apiMode := stripeapi.ModePaymentIntents
	if c.mode == ModeNaive {
		apiMode = stripeapi.ModeCharges
	}
	sc, err := c.stripe(apiMode, timeouts)
	if err != nil {
		return err
	}
	r := newRig()
	if c.mode == ModeNaive {
		a, err := c.naiveConsumer("worker-1", 1, false, sc)
		if err != nil {
			return err
		}
		r.runNaive(ctx, a, c.log)
	} else {
		cons, err := consumer.New(c.pelguardConfig("", sc))
		if err != nil {
			return err
		}
		if err := cons.Start(ctx); err != nil {
			return err
		}
		r.stops = append(r.stops, cons.Stop)
	}
	// Phase 1 ends when the lost entries, and only they, are pending and
	// (pelguard) every other event is billed. On a loaded machine one more
	// can be left pending (a lease renewal that timed out cancels its work;
	// a transient error) and nothing in phase 1 retries it: exact counts
	// would then wait forever. So the phase also ends once the lost ones at
	// least are pending and nothing has moved for phaseOneSettle; phase 2
	// redelivers the extra entries with them, under the same verdicts.
	var last state
	moved := time.Now()
	werr := c.waitUntil(ctx, func(s state) bool {
		if s != last {
			last, moved = s, time.Now()
		}
		if s.lag != 0 || s.pending < int64(len(lost)) {
			return false
		}
		exact := s.pending == int64(len(lost)) && (c.mode == ModeNaive || s.terminal == len(c.events)-len(lost))
		return exact || time.Since(moved) >= phaseOneSettle
	})
	if err := errors.Join(werr, r.stop()); err != nil {
		return err
	}

	// A day and an hour later.
	c.sim.Advance(25 * time.Hour)
	c.clk.Advance(25 * time.Hour)

	if c.mode == ModeNaive {
		a, aerr := c.naiveConsumer("worker-1", 1, false, sc)
		if aerr != nil {
			return aerr
		}
		r, err = c.startNaive(ctx, a)
	} else {
		r, err = c.startPelguard(ctx, "", sc)
	}
	return c.drain(ctx, r, err)
}

// aofRollback is failure mode 3, "AOF rollback", on a redis-server of the
// drill's own (appendonly yes, appendfsync everysec). A consumer reads every
// event and works through them; partway, Redis persists its state (the last
// fsync before a crash); the last quarter are charged and acked after it.
// Redis is then killed and restarted from that state: those acks are lost
// and the entries are pending again. The naive monitor reclaims them and
// consumer-B charges them again; pelguard's consumer (same pinned name)
// drains its own PEL and the ledger says every one is billed: acked, no
// Stripe call.
func aofRollback(ctx context.Context, c *cell) error {
	srv, err := startRedisServer(ctx, c.log)
	if err != nil {
		return err
	}
	defer srv.close()
	c.rdb, c.redisURL = srv.client, srv.url()

	if _, err := c.publish(ctx); err != nil {
		return err
	}
	msgs, err := c.readAll(ctx, "worker-1", int64(len(c.events)))
	if err != nil {
		return err
	}
	if len(msgs) != len(c.events) {
		return fmt.Errorf("read %d of %d events", len(msgs), len(c.events))
	}
	cut := len(msgs) - max(1, len(msgs)/4)

	var process func(context.Context, int, int) error
	if c.mode == ModeNaive {
		sc, serr := c.stripe(stripeapi.ModeCharges, nil)
		if serr != nil {
			return serr
		}
		w, werr := c.naiveConsumer("worker-1", 1, false, sc)
		if werr != nil {
			return werr
		}
		process = func(ctx context.Context, from, to int) error { return w.ProcessClaimed(ctx, msgs[from:to]) }
	} else {
		sc, serr := c.stripe(stripeapi.ModePaymentIntents, nil)
		if serr != nil {
			return serr
		}
		p, perr := consumer.NewProcessor(c.pelguardConfig("worker-1", sc))
		if perr != nil {
			return perr
		}
		hbCtx, stopHB := context.WithCancel(ctx)
		defer stopHB()
		go p.RunHeartbeat(hbCtx)
		process = func(ctx context.Context, from, to int) error {
			return processAll(ctx, p, c.stream, msgs[from:to])
		}
	}
	c.d.progress.update(c, "processing, then persisting the AOF")
	if err := process(ctx, 0, cut); err != nil {
		return err
	}
	snap, err := srv.snapshot(ctx)
	if err != nil {
		return err
	}
	if err := process(ctx, cut, len(msgs)); err != nil {
		return err
	}
	c.d.progress.update(c, "crashing Redis and restarting it from the AOF")
	if err := srv.crashAndRestore(ctx, snap); err != nil {
		return err
	}
	if p, err := c.rdb.XPending(ctx, c.stream, c.group).Result(); err != nil {
		return fmt.Errorf("XPENDING after the rollback: %w", err)
	} else if p.Count == 0 {
		return errors.New("the rollback returned no acked entry to the PEL: the drill did not reproduce AOF rollback")
	}

	var r *rig
	if c.mode == ModeNaive {
		sc, serr := c.stripe(stripeapi.ModeCharges, nil)
		if serr != nil {
			return serr
		}
		w, werr := c.naiveConsumer("worker-1", 1, false, sc)
		if werr != nil {
			return werr
		}
		r, err = c.startNaive(ctx, w)
	} else {
		sc, serr := c.stripe(stripeapi.ModePaymentIntents, nil)
		if serr != nil {
			return serr
		}
		// The pinned name drains its own PEL first after a restart.
		r, err = c.startPelguard(ctx, "worker-1", sc)
	}
	return c.drain(ctx, r, err)
}

// processAll runs msgs through p four at a time, as a consumer's workers
// would, and fails if any is left pending.
func processAll(ctx context.Context, p *consumer.Processor, stream string, msgs []redis.XMessage) error {
	var mu sync.Mutex
	var errs []error
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for _, m := range msgs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out, err := p.Process(ctx, stream, m)
			if err == nil && !out.Acked() {
				err = fmt.Errorf("entry %s left pending (%s)", m.ID, out)
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
