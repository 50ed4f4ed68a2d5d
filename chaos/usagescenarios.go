package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/naive"
	"github.com/pelguard/pelguard/stripeapi"
)

// The usage scenarios: the seed's failure modes for meter events, and a
// redelivery past Stripe's identifier window. Each runs in three modes: the
// naive sender without an identifier (every re-send counts), with the
// event's id as identifier and no ledger (Stripe refuses a repeat only
// within its window of at least 24 h), and pelguard's meter consumer.

// usageInflightReclaim is failure mode 1 for meter events, "reclaim while
// in flight": a twentieth of the calls take three times the monitor's
// min-idle (fewer than in the charge scenario: each one holds a batch of
// pelguard's up to its end, and the drill's time matters). The monitor reclaims the slow sender's entry and consumer-B
// sends the event again: without an identifier Stripe counts it twice;
// with one, the second call is refused (or answered from Stripe's
// idempotency record) and acked. pelguard's heartbeat keeps the ledger
// lease live through the call, and the reaper leaves a leased entry alone.
func usageInflightReclaim(ctx context.Context, c *cell) error {
	n := len(c.usage.events)
	slow := &faults{slow: c.meterKeys(c.pick(max(1, n/20), 0, n)), delay: 3 * c.d.cfg.MinIdle}
	if _, err := c.publishUsage(ctx); err != nil {
		return err
	}
	sc, err := c.stripe(stripeapi.ModePaymentIntents, slow)
	if err != nil {
		return err
	}
	var r *rig
	if c.mode == ModePelguard {
		// Two consumers, against the naive mode's four senders.
		r, err = c.startPelguardMeter(ctx, sc, "", "")
	} else {
		var senders []*naive.MeterConsumer
		for i := range 4 {
			s, serr := c.naiveMeter(fmt.Sprintf("worker-%d", i+1), 1, false, sc, nil)
			if serr != nil {
				return serr
			}
			senders = append(senders, s)
		}
		r, err = c.startNaiveMeter(ctx, senders...)
	}
	return c.drain(ctx, r, err)
}

// usagePartialBatch is failure mode 2 for meter events, "partial batch":
// COUNT 10 batches where, in half of them, the 7th event is recorded at
// Stripe but its reply is lost (a timeout). The naive sender acks a batch
// only at its end, so the monitor reclaims the whole batch and consumer-B
// sends 1–7 again. pelguard records and acks per event; the 7th (its lease
// released) is re-sent under its identifier within Stripe's window, by its
// consumer re-reading its pending entries or by the reaper's re-drive.
func usagePartialBatch(ctx context.Context, c *cell) error {
	if _, err := c.publishUsage(ctx); err != nil {
		return err
	}
	batches := len(c.usage.events) / 10
	lose := map[int]bool{}
	for b := range c.pick(max(1, batches/2), 0, batches) {
		lose[10*b+6] = true
	}
	timeouts := &faults{lose: c.meterKeys(lose), hang: 100 * time.Millisecond}
	sc, err := c.stripe(stripeapi.ModePaymentIntents, timeouts)
	if err != nil {
		return err
	}
	var r *rig
	if c.mode == ModePelguard {
		r, err = c.startPelguardMeter(ctx, sc, "")
	} else {
		s, serr := c.naiveMeter("worker-1", 10, true, sc, nil)
		if serr != nil {
			return serr
		}
		r, err = c.startNaiveMeter(ctx, s)
	}
	return c.drain(ctx, r, err)
}

// usageAOFRollback is failure mode 3 for meter events, "AOF rollback", on a
// redis-server of the drill's own: the last quarter of the events are sent
// and acked after the last persisted state, Redis is killed and restarted
// from it, and those entries are pending again. The naive monitor reclaims
// them and consumer-B sends them again (within Stripe's window, the
// identifier saves the naive-identifier mode); pelguard's consumer (same
// pinned name) drains its own pending entries, and the reaper those idle
// past min-idle: the ledger says delivered, acked, no call.
func usageAOFRollback(ctx context.Context, c *cell) error {
	srv, err := startRedisServer(ctx, c.log)
	if err != nil {
		return err
	}
	defer srv.close()
	c.rdb, c.redisURL = srv.client, srv.url()
	// The dead letters are on this server: count them before it goes.
	defer func() {
		if err := c.readDeadLetters(ctx); err != nil {
			c.log.Warn("chaos: counting the dead letters failed", "error", err)
		}
	}()

	if _, err := c.publishUsage(ctx); err != nil {
		return err
	}
	msgs, err := c.readAll(ctx, "worker-1", int64(len(c.usage.events)))
	if err != nil {
		return err
	}
	if len(msgs) != len(c.usage.events) {
		return fmt.Errorf("read %d of %d events", len(msgs), len(c.usage.events))
	}
	cut := len(msgs) - max(1, len(msgs)/4)
	sc, err := c.stripe(stripeapi.ModePaymentIntents, nil)
	if err != nil {
		return err
	}
	var process func(context.Context, []redis.XMessage) error
	if c.mode == ModePelguard {
		mc, merr := consumer.NewMeterConsumer(c.meterConfig("worker-1", sc, nil))
		if merr != nil {
			return merr
		}
		process = func(ctx context.Context, msgs []redis.XMessage) error { return processMeterBatches(ctx, mc, msgs) }
	} else {
		w, werr := c.naiveMeter("worker-1", 1, false, sc, nil)
		if werr != nil {
			return werr
		}
		process = w.ProcessClaimed
	}
	c.d.progress.update(c, "sending, then persisting the AOF")
	if err := process(ctx, msgs[:cut]); err != nil {
		return err
	}
	snap, err := srv.snapshot(ctx)
	if err != nil {
		return err
	}
	if err := process(ctx, msgs[cut:]); err != nil {
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
	if c.mode == ModePelguard {
		r, err = c.startPelguardMeter(ctx, sc, "worker-1")
	} else {
		w, werr := c.naiveMeter("worker-1", 1, false, sc, nil)
		if werr != nil {
			return werr
		}
		r, err = c.startNaiveMeter(ctx, w)
	}
	return c.drain(ctx, r, err)
}

// usage25hGap is a redelivery past Stripe's identifier window: a fifth of
// the events are recorded at Stripe but their replies are lost (outcome
// unknown), and a tenth are sent but their XACK is lost (a crash between
// the reply, or pelguard's ledger write, and the ack). Their entries stay
// pending while a day and an hour pass (the emulator's clock and the
// ledger's move together); then the monitor (naive) or the reaper
// (pelguard) takes them over. Both naive senders send them again and
// Stripe counts them again: it forgot the identifiers. pelguard's reaper
// finds the acked-late ones delivered in the ledger (acked, no call) and
// claims the unknown ones, whose re-drive parks them with an alert: past
// the safe window nothing is re-sent.
func usage25hGap(ctx context.Context, c *cell) error {
	n := len(c.usage.events)
	lost := c.pick(max(1, n/5), 0, n)
	ackLost := map[int]bool{}
	for _, i := range c.rng.Perm(n) {
		if len(ackLost) == max(1, n/10) {
			break
		}
		if !lost[i] {
			ackLost[i] = true
		}
	}
	ids, err := c.publishUsage(ctx)
	if err != nil {
		return err
	}
	dropIDs := map[string]bool{}
	for i := range ackLost {
		dropIDs[ids[i]] = true
	}
	crashy, err := cli.OpenRedis(ctx, c.redisURL)
	if err != nil {
		return err
	}
	defer crashy.Close()
	crashy.AddHook(dropAcks{ids: dropIDs})

	// Phase 1: one sender reads everything and works through it; no
	// monitor, no restart, so what it leaves stays pending, as entries
	// stuck for a day do.
	msgs, err := c.readAll(ctx, "worker-1", int64(n))
	if err != nil {
		return err
	}
	sc, err := c.stripe(stripeapi.ModePaymentIntents, &faults{lose: c.meterKeys(lost), hang: 20 * time.Millisecond})
	if err != nil {
		return err
	}
	c.d.progress.update(c, "sending; replies and acks lost")
	if c.mode == ModePelguard {
		mc, merr := consumer.NewMeterConsumer(c.meterConfig("worker-1", sc, crashy))
		if merr != nil {
			return merr
		}
		// The lost XACKs fail their batches: expected, not an error.
		_ = processMeterBatches(ctx, mc, msgs)
	} else {
		w, werr := c.naiveMeter("worker-1", 1, false, sc, crashy)
		if werr != nil {
			return werr
		}
		for _, m := range msgs {
			// A lost reply or ack leaves the entry pending: expected.
			_ = w.ProcessClaimed(ctx, []redis.XMessage{m})
		}
	}
	p, err := c.rdb.XPending(ctx, c.stream, c.group).Result()
	if err != nil {
		return fmt.Errorf("XPENDING after the first phase: %w", err)
	}
	if p.Count < int64(len(lost)+len(ackLost)) {
		return fmt.Errorf("%d entries pending after the first phase, want at least %d: the drill did not reproduce the gap",
			p.Count, len(lost)+len(ackLost))
	}

	// A day and an hour later.
	c.sim.Advance(25 * time.Hour)
	c.clk.Advance(25 * time.Hour)
	c.usage.callsAtGap = c.meterCalls()

	plain, err := c.stripe(stripeapi.ModePaymentIntents, nil)
	if err != nil {
		return err
	}
	var r *rig
	if c.mode == ModePelguard {
		// A fresh consumer: worker-1's entries are the reaper's to decide,
		// as the monitor decides them in the naive modes.
		r, err = c.startPelguardMeter(ctx, plain, "")
	} else {
		r, err = c.startNaiveMeter(ctx)
	}
	return c.drain(ctx, r, err)
}

// errAckLost is the XACK a crash swallowed.
var errAckLost = errors.New("chaos: connection lost before XACK (the process crashed)")

// dropAcks is a go-redis hook failing every XACK that names one of ids, as
// a crash right before the ack would: the call and the ledger write happen,
// the entry stays pending.
type dropAcks struct{ ids map[string]bool }

func (dropAcks) DialHook(next redis.DialHook) redis.DialHook { return next }

func (dropAcks) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h dropAcks) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); strings.EqualFold(cmd.Name(), "xack") && len(args) > 3 {
			for _, a := range args[3:] {
				if id, ok := a.(string); ok && h.ids[id] {
					cmd.SetErr(errAckLost)
					return errAckLost
				}
			}
		}
		return next(ctx, cmd)
	}
}
