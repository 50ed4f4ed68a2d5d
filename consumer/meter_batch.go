package consumer

// A batch of stream entries (ProcessBatch, Redrive). With SendFromLedger
// it is recorded at ingest and acked (meter_ingest.go) and sent from the
// ledger later (meter_sender.go, which makes its calls with sendAll too).
// Without it, it is reserved, sent per event Workers at once (sendAll: one
// call per customer and meter, leases renewed by heartbeat), finished, and
// then settled: witnessed, acked and dead-lettered.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/meterwitness"
	"github.com/pelguard/pelguard/stripeapi"
)

// pendingMsg is one entry of a batch on its way through.
type pendingMsg struct {
	msg   redis.XMessage
	req   meterledger.Request
	claim meterledger.Claim
	out   meterledger.Outcome
	// keyErr: Stripe refused the key itself (401, or 403 for a missing
	// permission); out is Failed, so a replay reopens the row.
	keyErr error
	// missingMeter: Stripe has no active meter for the event's name.
	missingMeter bool
}

// ProcessBatch handles entries of the stream (new, redelivered or
// reclaimed): validation, one Reserve for the batch, the Stripe calls (at
// most Workers at once, one per customer and meter), one Finish, then the
// witness's mirror, the acks and the dead letters. Entries it leaves
// pending are redelivered.
func (c *MeterConsumer) ProcessBatch(ctx context.Context, msgs []redis.XMessage) (MeterBatch, error) {
	b, _, err := c.process(ctx, msgs)
	return b, err
}

// Redrive processes entries the reaper claimed to this consumer's name,
// going back to those left pending for as long as a round makes progress:
// a customer's meter takes one call at a time, so a dead consumer's batch
// of one busy customer is sent over as many rounds as it has events. What
// is still left (a slot held by a live consumer's call, a transient error)
// stays pending for the reaper's next pass.
func (c *MeterConsumer) Redrive(ctx context.Context, msgs []redis.XMessage) (MeterBatch, error) {
	var total MeterBatch
	for len(msgs) > 0 && ctx.Err() == nil {
		b, left, err := c.process(ctx, msgs)
		total.Delivered += b.Delivered
		total.Already += b.Already
		total.DeadLetters += b.DeadLetters
		total.Parked += b.Parked
		total.OverCap += b.OverCap
		if total.Outcomes == nil {
			total.Outcomes = b.Outcomes
		} else {
			maps.Copy(total.Outcomes, b.Outcomes) // a later round's outcome is the entry's last
		}
		if err != nil {
			total.Left = len(msgs)
			return total, err
		}
		if len(left) == len(msgs) {
			break // no progress this round
		}
		msgs = left
	}
	total.Left = len(msgs)
	return total, nil
}

// process is ProcessBatch, also returning the entries it left pending.
func (c *MeterConsumer) process(ctx context.Context, msgs []redis.XMessage) (MeterBatch, []redis.XMessage, error) {
	if c.cfg.SendFromLedger || c.ledgerFenced(ctx) {
		return c.ingest(ctx, msgs)
	}
	var b MeterBatch
	var left []redis.XMessage
	now := c.cfg.Clock.Now()
	var dead []Dead
	var reqs []meterledger.Request
	var items []*pendingMsg
	for _, m := range msgs {
		r, bad, err := c.requestOf(m, now)
		if err != nil {
			return b, msgs, err
		}
		if bad != nil {
			dead = append(dead, *bad)
			c.count(&b, m.ID, OutcomeDeadLetter)
			continue
		}
		reqs = append(reqs, r)
		items = append(items, &pendingMsg{msg: m, req: r})
	}
	claims, err := c.ledger.Reserve(ctx, reqs)
	if err != nil {
		return b, msgs, fmt.Errorf("reserving %d meter events: %w", len(reqs), err)
	}
	var acks []string
	var sent []meterwitness.Sent
	var send []*pendingMsg
	for i, cl := range claims {
		it := items[i]
		it.claim = cl
		switch cl.Decision {
		case meterledger.Acquired, meterledger.TakenOver, meterledger.Reopened:
			send = append(send, it)
		case meterledger.AlreadyDelivered, meterledger.AlreadyTerminal:
			c.ended(&b, it.msg, it.req, cl.Record, &acks, &dead, &sent)
		case meterledger.Parked:
			b.Parked++
			sent = append(sent, sentOf(it.req, cl.Record, meterledger.StatusParked, cl.Reason))
			c.alertParked(it.req, cl.Reason)
			dead = append(dead, Dead{Msg: it.msg, Reason: ReasonMeterParked, Detail: cl.Reason, Alerted: true})
			c.count(&b, it.msg.ID, OutcomeParked)
		case meterledger.ReplayRefused:
			// Nothing sent: back to the dead letters, with what to do.
			dead = append(dead, Dead{Msg: it.msg, Reason: ReasonMeterReplayRefused, Detail: cl.Reason})
			c.count(&b, it.msg.ID, OutcomeDeadLetter)
		case meterledger.OutsideWindow:
			dead = append(dead, Dead{Msg: it.msg, Reason: event.ReasonTimestampOutside, Detail: cl.Reason})
			c.count(&b, it.msg.ID, OutcomeDeadLetter)
		case meterledger.Conflict:
			dead = append(dead, Dead{Msg: it.msg, Reason: ReasonConflict, Detail: cl.Reason})
			c.count(&b, it.msg.ID, OutcomeDeadLetter)
		case meterledger.OverCap:
			// Nothing sent or written: a replay once the cap is raised
			// sends it.
			b.OverCap++
			s := cl.Cap
			NotifyCapOnce(ctx, c.cfg.Redis, c.cfg.Notifier, c.cfg.Schema, c.cfg.Namespace,
				alerts.MeterCapReached(it.req.Event.EventName, it.req.Event.StripeCustomerID, s.Month.Format("2006-01"),
					s.Cap.Cap, s.Cap.Used(s.Units, s.Events), string(s.Cap.Counts), it.req.Event.Value, c.cfg.Stream))
			dead = append(dead, Dead{Msg: it.msg, Reason: ReasonSpendCap, Detail: cl.Reason, Alerted: true})
			c.count(&b, it.msg.ID, OutcomeSpendCap)
		default: // Busy, SlotBusy, Held
			b.Left++
			left = append(left, it.msg)
			c.count(&b, it.msg.ID, OutcomeBusy)
		}
	}
	c.sendAll(ctx, send)
	outs := make([]meterledger.Outcome, len(send))
	for i, it := range send {
		outs[i] = it.out
	}
	results, err := c.ledger.FinishResults(context.WithoutCancel(ctx), outs)
	if err != nil {
		return b, msgs, fmt.Errorf("recording %d meter events: %w", len(outs), err)
	}
	for i, it := range send {
		if results[i] == meterledger.Park && it.out.Result == meterledger.Failed {
			// Refused after an attempt of unknown outcome: Stripe may count
			// that attempt, so the ledger parked it (its units stay counted).
			it.out.Result, it.out.Reason = meterledger.Park, meterledger.ParkedAfterUnknown+": "+it.out.Reason
			if it.keyErr != nil {
				c.cfg.Notifier.Notify(alerts.StripeKeyRejected(it.keyErr))
			}
		}
		switch {
		case results[i] == 0 || it.out.Result == meterledger.Release || it.out.Result == meterledger.Unsent:
			b.Left++ // lost its lease, or a transient outcome: the next delivery decides
			left = append(left, it.msg)
			c.count(&b, it.msg.ID, OutcomeRetryLater)
		case it.out.Result == meterledger.Delivered:
			b.Delivered++
			acks = append(acks, it.msg.ID)
			sent = append(sent, sentOf(it.req, it.claim.Record, meterledger.StatusDelivered, ""))
			c.count(&b, it.msg.ID, OutcomeDelivered)
		case it.out.Result == meterledger.Failed && it.keyErr != nil:
			// Nothing was counted; one alert per key problem (deduplicated
			// by its fingerprint), and a replay once the key is fixed.
			dead = append(dead, Dead{Msg: it.msg, Reason: ReasonStripeKey, Detail: it.out.Reason, Alerted: true})
			c.cfg.Notifier.Notify(alerts.StripeKeyRejected(it.keyErr))
			c.count(&b, it.msg.ID, OutcomeFailed)
		case it.out.Result == meterledger.Failed:
			told := it.missingMeter && c.sayMeterMissing(it.req.Event.EventName)
			dead = append(dead, Dead{Msg: it.msg, Reason: ReasonMeterRefused, Detail: it.out.Reason, Alerted: told})
			c.count(&b, it.msg.ID, OutcomeFailed)
		case it.out.Result == meterledger.Park:
			b.Parked++
			sent = append(sent, sentOf(it.req, it.claim.Record, meterledger.StatusParked, it.out.Reason))
			c.alertParked(it.req, it.out.Reason)
			dead = append(dead, Dead{Msg: it.msg, Reason: ReasonMeterParked, Detail: it.out.Reason, Alerted: true})
			c.count(&b, it.msg.ID, OutcomeParked)
		}
	}
	err = c.settle(ctx, acks, dead, sent, &b)
	if err == nil {
		c.live.events.Add(int64(len(msgs) - len(left)))
	}
	return b, left, err
}

// sendAll makes the Stripe calls, Workers at once, renewing the leases and
// slots of those in flight every Lease/3.
func (c *MeterConsumer) sendAll(ctx context.Context, send []*pendingMsg) {
	if len(send) == 0 {
		return
	}
	hctx, stop := context.WithCancel(ctx)
	defer stop()
	go c.heartbeat(hctx, send)
	slots := make(chan struct{}, c.cfg.Workers)
	var wg sync.WaitGroup
	for _, it := range send {
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer func() { <-slots; wg.Done() }()
			r := it.req
			if c.cfg.Paused != nil && c.cfg.Paused() {
				// Paused since the batch was reserved: no call. The event
				// stays pending and is sent on resume.
				it.out = meterledger.Outcome{Hold: it.claim.Hold(), Result: meterledger.Unsent}
				return
			}
			c.cfg.Metrics.held(c.cfg.Stream, 1)
			defer c.cfg.Metrics.held(c.cfg.Stream, -1)
			start := time.Now()
			_, err := c.cfg.Stripe.SendMeterEvent(ctx, stripeapi.MeterEvent{EventName: r.Event.EventName,
				StripeCustomerID: r.Event.StripeCustomerID, Value: r.Event.Value, Identifier: r.Identifier, Timestamp: r.Event.Timestamp})
			c.cfg.Metrics.stripeCall(resultClass(err), time.Since(start).Seconds())
			it.out = meterOutcome(it.claim.Hold(), err)
			if errors.Is(err, stripeapi.ErrAuthentication) || errors.Is(err, stripeapi.ErrPermission) {
				it.keyErr = err
			}
			it.missingMeter = stripeapi.IsMissingMeter(err)
			if it.out.Result == meterledger.Release && !rateLimited(err) {
				// Sent again on its next delivery; say why, or a bad key
				// or a Stripe outage looks like a stalled stream.
				c.cfg.Logger.Warn("meter event not confirmed; it stays pending and is sent again under its identifier",
					"stream", c.cfg.Stream, "id", it.msg.ID, "identifier", r.Identifier, "err", err)
			}
		}()
	}
	wg.Wait()
}

func (c *MeterConsumer) heartbeat(ctx context.Context, send []*pendingMsg) {
	holds := make([]meterledger.Hold, len(send))
	for i, it := range send {
		holds[i] = it.claim.Hold()
	}
	t := time.NewTicker(max(c.cfg.Lease/3, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := c.ledger.ExtendMany(ctx, holds, c.cfg.Lease); err != nil && ctx.Err() == nil {
				c.cfg.Logger.Warn("renewing meter event leases", "err", err)
			}
		}
	}
}

// ended settles entry m whose event the ledger had already ended
// (delivered, refused, parked, or settled): the witness of a delivered or
// parked one, then its ack. One left to a person
// (meterledger.Record.LeftToAPerson) is dead-lettered instead, with the
// row's reason, so that they can settle it and replay it: parked before
// its entry was acked (by the usage repair after a ledger rollback, which
// writes no dead letter, or by a consumer whose dead letter and ack a
// Redis rollback lost), or settled as not counted since. Its parking was
// alerted already (ledger_repaired, meter_event_parked). A replay is
// decided by the ledger instead (refused or reopened).
func (c *MeterConsumer) ended(b *MeterBatch, m redis.XMessage, r meterledger.Request, rec meterledger.Record,
	acks *[]string, dead *[]Dead, sent *[]meterwitness.Sent) {
	if st := rec.Status; st == meterledger.StatusDelivered || st == meterledger.StatusParked {
		*sent = append(*sent, sentOf(r, rec, st, rec.LastError))
	}
	if rec.LeftToAPerson() && !r.Replay {
		b.Parked++
		*dead = append(*dead, Dead{Msg: m, Reason: ReasonMeterParked, Detail: rec.LastError, Alerted: true})
		c.count(b, m.ID, OutcomeParked)
		return
	}
	b.Already++
	*acks = append(*acks, m.ID)
	c.count(b, m.ID, OutcomeAlreadyBilled)
}

// settle mirrors the ledger witness and writes the meter witness, then
// acks and dead-letters (invariant 3: the ledger writes above have
// committed).
func (c *MeterConsumer) settle(ctx context.Context, acks []string, dead []Dead, sent []meterwitness.Sent, b *MeterBatch) error {
	if len(acks) == 0 && len(dead) == 0 {
		return nil
	}
	ctx, cancel := detach(ctx)
	defer cancel()
	if err := c.cfg.Witness.Mirror(ctx); err != nil {
		return err // nothing acked: the redeliveries find the rows delivered
	}
	if err := c.recordSent(ctx, sent); err != nil {
		return err // nothing acked: the redeliveries witness them again
	}
	if len(acks) > 0 {
		if err := c.cfg.Redis.XAck(ctx, c.cfg.Stream, c.cfg.Group, acks...).Err(); err != nil {
			return fmt.Errorf("XACK %d meter events: %w", len(acks), err)
		}
	}
	if len(dead) > 0 {
		for i, err := range DeadLetterMany(ctx, c.cfg.Redis, c.cfg.Stream, c.cfg.Group, c.cfg.Name, dead, c.cfg.Clock.Now()) {
			if err != nil {
				return fmt.Errorf("dead-lettering %s: %w", dead[i].Msg.ID, err)
			}
			b.DeadLetters++
			c.cfg.Metrics.deadLetter(c.cfg.Stream, dead[i].Reason)
			if c.cfg.DeadLetters != nil && !dead[i].Alerted {
				c.cfg.DeadLetters.Add(c.cfg.Stream, dead[i].Reason, dead[i].Msg.ID, CustomerOf(dead[i].Msg))
			}
		}
	}
	return nil
}
