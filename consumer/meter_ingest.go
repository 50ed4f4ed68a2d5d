package consumer

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/meterwitness"
)

// Usage at volume (MeterConfig.SendFromLedger; DESIGN.md "Usage at
// volume"): a batch of entries is recorded in the ledger (Ingest: each
// event once, its spend cap decided), witnessed, and acked; the stream's
// pending entries hold only what is not in the ledger yet. Senders in the
// same process read the ledger, never the entries: each round takes the
// next event of every customer-meter whose slot is free, so a customer
// with a backlog gets one call per round like every other, and nobody
// waits behind its entries.

// ingest is process for SendFromLedger.
func (c *MeterConsumer) ingest(ctx context.Context, msgs []redis.XMessage) (MeterBatch, []redis.XMessage, error) {
	var b MeterBatch
	var left []redis.XMessage
	now := c.cfg.Clock.Now()
	var dead []Dead
	var reqs []meterledger.IngestRequest
	var kept []redis.XMessage
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
		reqs = append(reqs, meterledger.IngestRequest{Request: r, Stream: c.cfg.Stream, Fields: m.Values})
		kept = append(kept, m)
	}
	got, err := c.ledger.Ingest(ctx, reqs)
	if err != nil {
		return b, msgs, err
	}
	var acks []string
	var sent []meterwitness.Sent
	for i, g := range got {
		m, r := kept[i], reqs[i].Request
		switch g.Decision {
		case meterledger.Queued, meterledger.InLedger:
			acks = append(acks, m.ID)
			sent = append(sent, sentOf(r, g.Record, meterledger.StatusQueued, ""))
			c.count(&b, m.ID, OutcomeProcessing)
		case meterledger.AlreadyDelivered, meterledger.AlreadyTerminal:
			b.Already++
			acks = append(acks, m.ID)
			if st := g.Record.Status; st == meterledger.StatusDelivered || st == meterledger.StatusParked {
				sent = append(sent, sentOf(r, g.Record, st, g.Record.LastError))
			}
			c.count(&b, m.ID, OutcomeAlreadyBilled)
		case meterledger.OverCap:
			b.OverCap++
			s := g.Cap
			c.cfg.Notifier.Notify(alerts.MeterCapReached(r.Event.EventName, r.Event.StripeCustomerID, s.Month.Format("2006-01"),
				s.Cap.Cap, s.Cap.Used(s.Units, s.Events), string(s.Cap.Counts), r.Event.Value, c.cfg.Stream))
			dead = append(dead, Dead{Msg: m, Reason: ReasonSpendCap, Detail: g.Reason})
			c.count(&b, m.ID, OutcomeSpendCap)
		case meterledger.ReplayRefused:
			dead = append(dead, Dead{Msg: m, Reason: ReasonMeterReplayRefused, Detail: g.Reason})
			c.count(&b, m.ID, OutcomeDeadLetter)
		case meterledger.OutsideWindow:
			dead = append(dead, Dead{Msg: m, Reason: event.ReasonTimestampOutside, Detail: g.Reason})
			c.count(&b, m.ID, OutcomeDeadLetter)
		case meterledger.Conflict:
			dead = append(dead, Dead{Msg: m, Reason: ReasonConflict, Detail: g.Reason})
			c.count(&b, m.ID, OutcomeDeadLetter)
		default: // Held
			b.Left++
			left = append(left, m)
			c.count(&b, m.ID, OutcomeBusy)
		}
	}
	return b, left, c.settle(ctx, acks, dead, sent, &b)
}

// startSenders starts, for SendFromLedger, Pipeline senders and fences the
// ledger against per-event consumers; a per-event consumer refuses to start
// on a fenced ledger. The returned func waits for the senders to end.
func (c *MeterConsumer) startSenders(ctx context.Context) (func(), error) {
	if !c.cfg.SendFromLedger {
		fenced, since, err := c.ledger.SendsFenced(ctx)
		if err != nil {
			return nil, err
		}
		if fenced {
			return nil, fmt.Errorf("%w (since %s)", meterledger.ErrPerEventFenced, since.Format(time.RFC3339))
		}
		return func() {}, nil
	}
	if err := c.ledger.FenceSends(ctx, c.cfg.Name); err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	for i := range c.cfg.Pipeline {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sleep(ctx, time.Duration(i)*20*time.Millisecond) // staggered: rounds overlap, not collide
			for ctx.Err() == nil {
				if c.cfg.Paused != nil && c.cfg.Paused() {
					sleep(ctx, pausePoll)
					continue
				}
				n, err := c.SendRound(ctx)
				switch {
				case err != nil && ctx.Err() == nil:
					c.cfg.Logger.Warn("sending meter events from the ledger", "stream", c.cfg.Stream, "err", err)
					sleep(ctx, time.Second)
				case n == 0:
					sleep(ctx, ownRevisitIdle)
				}
			}
		}()
	}
	return wg.Wait, nil
}

// SendRound sends the next event of up to Workers customer-meters from the
// ledger (Unsent, then Reserve: the same decisions and fences as a
// per-event send, an unknown outcome taken over within the safe window and
// parked past it), records the outcomes, witnesses them and dead-letters
// refusals from the ledger's copy of their entries. It returns how many
// calls it made.
func (c *MeterConsumer) SendRound(ctx context.Context) (int, error) {
	na, err := c.sendAggregates(ctx)
	if err != nil {
		return na, err
	}
	recs, err := c.ledger.Unsent(ctx, c.cfg.Stream, c.cfg.Workers)
	if err != nil || len(recs) == 0 {
		return na, err
	}
	var forms []meterledger.Record
	var perEvent []meterledger.Record
	for _, r := range recs {
		switch {
		case r.Status == meterledger.StatusQueued && slices.Contains(c.cfg.AggregateMeters, r.EventName):
			if !c.cfg.Witness.Suspect() {
				forms = append(forms, r)
			}
			// While a rollback is unrepaired no aggregate is formed: one of
			// that second may have been sent and lost with the ledger's
			// rows; the repair restores it from the witness first.
		default:
			perEvent = append(perEvent, r)
		}
	}
	if len(forms) > 0 {
		n, err := c.formAndSend(ctx, forms)
		na += n
		if err != nil {
			return na, err
		}
	}
	recs = perEvent
	if len(recs) == 0 {
		return na, nil
	}
	items := make([]*pendingMsg, len(recs))
	reqs := make([]meterledger.Request, len(recs))
	for i, r := range recs {
		reqs[i] = meterledger.Request{Event: meterledger.EventOf(r), Identifier: r.Identifier, Owner: c.cfg.Name,
			Lease: c.cfg.Lease, MessageID: r.StreamMessageID, Suspect: c.cfg.Witness.Suspect()}
		items[i] = &pendingMsg{msg: redis.XMessage{ID: r.StreamMessageID, Values: meterledger.FieldsOf(r)}, req: reqs[i]}
		if items[i].msg.Values == nil {
			items[i].msg.Values = map[string]any{"identifier": r.Identifier, event.PayloadField: meterledger.EventOf(r).Payload()}
		}
	}
	claims, err := c.ledger.Reserve(ctx, reqs)
	if err != nil {
		return 0, err
	}
	var b MeterBatch
	var send []*pendingMsg
	var dead []Dead
	var sent []meterwitness.Sent
	for i, cl := range claims {
		it := items[i]
		it.claim = cl
		switch {
		case cl.Decision.MaySend():
			send = append(send, it)
		case cl.Decision == meterledger.Parked:
			b.Parked++
			sent = append(sent, sentOf(it.req, cl.Record, meterledger.StatusParked, cl.Reason))
			c.alertParked(it.req, cl.Reason)
			dead = append(dead, Dead{Msg: it.msg, Reason: ReasonMeterParked, Detail: cl.Reason})
		}
	}
	c.sendAll(ctx, send)
	outs := make([]meterledger.Outcome, len(send))
	for i, it := range send {
		outs[i] = it.out
	}
	results, err := c.ledger.FinishResults(context.WithoutCancel(ctx), outs)
	if err != nil {
		return len(send), fmt.Errorf("recording %d meter events: %w", len(outs), err)
	}
	for i, it := range send {
		if results[i] == meterledger.Park && it.out.Result == meterledger.Failed {
			it.out.Result, it.out.Reason = meterledger.Park, meterledger.ParkedAfterUnknown+": "+it.out.Reason
		}
		switch {
		case results[i] == 0 || it.out.Result == meterledger.Release:
			// Stays sending: the next round takes it over under its identifier.
		case it.out.Result == meterledger.Delivered:
			b.Delivered++
			sent = append(sent, sentOf(it.req, it.claim.Record, meterledger.StatusDelivered, ""))
			c.cfg.Metrics.event(c.cfg.Stream, OutcomeDelivered)
		case it.out.Result == meterledger.Failed && it.keyErr != nil:
			dead = append(dead, Dead{Msg: it.msg, Reason: ReasonStripeKey, Detail: it.out.Reason})
			c.cfg.Notifier.Notify(alerts.StripeKeyRejected(it.keyErr))
			c.cfg.Metrics.event(c.cfg.Stream, OutcomeFailed)
		case it.out.Result == meterledger.Failed:
			dead = append(dead, Dead{Msg: it.msg, Reason: ReasonMeterRefused, Detail: it.out.Reason})
			c.cfg.Metrics.event(c.cfg.Stream, OutcomeFailed)
			if it.missingMeter {
				c.sayMeterMissing(it.req.Event.EventName)
			}
		case it.out.Result == meterledger.Park:
			b.Parked++
			sent = append(sent, sentOf(it.req, it.claim.Record, meterledger.StatusParked, it.out.Reason))
			c.alertParked(it.req, it.out.Reason)
			dead = append(dead, Dead{Msg: it.msg, Reason: ReasonMeterParked, Detail: it.out.Reason})
			c.cfg.Metrics.event(c.cfg.Stream, OutcomeParked)
		}
	}
	// The outcomes are committed: witness them (the repair's source for a
	// delivered row a rollback loses), then the dead letters.
	dctx, cancel := detach(ctx)
	defer cancel()
	if len(sent) > 0 {
		if err := c.cfg.Witness.Mirror(dctx); err != nil {
			return len(send), err
		}
		if err := c.recordSent(dctx, sent); err != nil {
			return len(send), err
		}
	}
	return na + len(send), c.settle(dctx, nil, dead, nil, &b)
}

// ledgerFenced reports whether the ledger sends from ingest: once true for
// good; while false, read again at most every 5 s.
func (c *MeterConsumer) ledgerFenced(ctx context.Context) bool {
	if c.fenced.Load() {
		return true
	}
	if now := time.Now().UnixNano(); now-c.checkedFence.Load() > int64(5*time.Second) {
		c.checkedFence.Store(now)
		if f, _, err := c.ledger.SendsFenced(ctx); err == nil && f {
			c.fenced.Store(true)
		}
	}
	return c.fenced.Load()
}
