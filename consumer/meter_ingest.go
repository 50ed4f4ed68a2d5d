package consumer

import (
	"context"
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
// pending entries hold only what is not in the ledger yet. The sender in
// the same process reads the ledger, never the entries (meter_sender.go),
// so nobody waits behind a busy customer's entries.

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
	if len(reqs) > 0 {
		oldest := reqs[0].Event.Timestamp
		for _, r := range reqs[1:] {
			if r.Event.Timestamp.Before(oldest) {
				oldest = r.Event.Timestamp
			}
		}
		c.ingested(oldest)
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
			c.ended(&b, m, r, g.Record, &acks, &dead, &sent)
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

// ingested lowers ingestedFrom to ts: the sender lists from there on.
func (c *MeterConsumer) ingested(ts time.Time) {
	for n := ts.UnixNano(); ; {
		old := c.ingestedFrom.Load()
		if n >= old || c.ingestedFrom.CompareAndSwap(old, n) {
			return
		}
	}
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
