package consumer

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/meterwitness"
	"github.com/pelguard/pelguard/internal/watermark"
)

// The sender (MeterConfig.SendFromLedger) sends what ingest recorded in the
// ledger, in rounds that overlap: whenever slots are free it lists the
// customer-meters whose oldest unsent event is oldest (one event, or one
// ready aggregate, each; meterledger.Candidates), skipping those a round
// of its own holds, and starts a round of up to Workers of them at once;
// up to SendSlots customer-meters are in flight. A round's ledger
// work is batched (one Reserve, one Finish), and a round that waits for
// its slowest call holds only its own customer-meters: the slots others
// free go to the next round at once. So a busy customer holds one slot
// and never more, and a quiet customer's event waits only for a free one.
// A customer-meter whose aggregates lately carried hotMembers events or
// more (a busy customer) is listed ahead of older work while it keeps
// sending: once caught up, it would otherwise wait behind every older
// quiet event of a backlog for its next second.

// keyOf is r's customer-meter: Stripe takes one of its events at a time.
func keyOf(r meterledger.Record) meterledger.MeterKey {
	return meterledger.MeterKey{EventName: r.EventName, StripeCustomerID: r.StripeCustomerID}
}

const (
	// senderRelist is how soon after a listing the sender lists again,
	// when its list is used up or a round has ended; senderStale is how
	// old a list gets before it is read again anyway (new events, slots
	// another consumer freed).
	senderRelist = 50 * time.Millisecond
	senderStale  = 500 * time.Millisecond
	// staleEvery is how often aggregates left sending by a holder that is
	// gone are looked for (sendAggregates).
	staleEvery = time.Second
	// floorEvery is how often the sender reads the ledger's oldest unsent
	// event (meterledger.UnsentFloor): listings read the partitions from
	// its day on, and from the oldest event this process ingested since.
	floorEvery = 5 * time.Second
	// statsEvery is how often the sender looks for partitions to analyze
	// (meterledger.FreshenStats): one read of their change counters. A
	// day's partition is analyzed within about a second of its first
	// thousand rows. Checked every 5 s, a run's first seconds (and each
	// UTC midnight's) were planned as if the day's partition were empty:
	// a customer at 5,000 events/s fell up to 1.7–3.3 s behind in the
	// first 10 s, against 1.3–1.5 s checked every second.
	statsEvery = time.Second
)

// startSenders starts, for SendFromLedger, the sender and the takeover of
// stale aggregates, and fences the ledger against per-event consumers; a
// per-event consumer refuses to start on a fenced ledger. The returned
// func waits for them to end.
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
	wg.Add(3)
	go func() { defer wg.Done(); c.sendLoop(ctx) }()
	go func() { defer wg.Done(); c.freshenStats(ctx) }()
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			if !c.paused() {
				if _, err := c.sendAggregates(ctx); err != nil && ctx.Err() == nil {
					c.cfg.Logger.Warn("taking over meter aggregates", "stream", c.cfg.Stream, "err", err)
				}
			}
			sleep(ctx, staleEvery)
		}
	}()
	return wg.Wait, nil
}

// sendLoop starts rounds on free slots until ctx ends; it returns once
// every round it started has ended.
func (c *MeterConsumer) sendLoop(ctx context.Context) {
	width := c.cfg.SendSlots
	var (
		wg       sync.WaitGroup
		inflight = map[meterledger.MeterKey]bool{}
		done     = make(chan roundEnd, width)
		from     meterledger.ListFrom
		floor    time.Time // the ledger's, read at floorAt
		floorAt  time.Time
		queue    []meterledger.Record // listed, not started yet
		listedAt time.Time
		ended    bool // a round ended since listedAt
		// hot: customer-meters that delivered an aggregate of at least
		// hotMembers events, and when they last did (meterledger.ListFrom.Hot).
		hot = map[meterledger.MeterKey]time.Time{}
	)
	defer wg.Wait()
	free := func(e roundEnd) {
		for _, k := range e.keys {
			delete(inflight, k)
		}
		// A customer-meter that just sent an aggregate and has another
		// bucket ready is tried again first: one with a backlog (a busy
		// customer) sends its buckets back to back, not one per listing.
		queue = append(e.next.again, queue...)
		for _, k := range e.next.hot {
			hot[k] = time.Now()
		}
		ended = true
	}
	// wait blocks until a round ends, d passes or ctx ends.
	wait := func(d time.Duration) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case e := <-done:
			free(e)
		case <-t.C:
		case <-ctx.Done():
		}
	}
	for ctx.Err() == nil {
		if c.paused() {
			wait(pausePoll)
			continue
		}
		// A round's ledger work is a few statements whatever its size: a
		// round starts with at least half a round's slots free while others
		// are in flight and there is that much to send (at volume, rounds
		// started on every freed slot carried 1.3 customer-meters each).
		if free := width - len(inflight); free <= 0 || len(inflight) > 0 && free < minRound(c.cfg.Workers) && len(queue) >= minRound(c.cfg.Workers) {
			wait(time.Minute)
			continue
		}
		// Listing costs the ledger a bounded read, not nothing (at volume,
		// listing after every round took a third of the ledger's time):
		// list again once the last list is used up, once a round ended
		// (its customer-meters may have more) with less than a round's
		// worth of slots' candidates left and senderRelist passed, or once
		// the list is senderStale old.
		since := time.Since(listedAt)
		relist := len(queue) == 0 || ended && len(queue) < width && since >= senderRelist || since >= senderStale
		if relist && since < senderRelist {
			wait(senderRelist - since)
			continue
		}
		if relist {
			from.Hot = hotKeys(hot, time.Now())
			if err := c.list(ctx, &from, &floor, &floorAt, &queue, 4*width); err != nil {
				if ctx.Err() == nil {
					c.cfg.Logger.Warn("listing meter events to send", "stream", c.cfg.Stream, "err", err)
					wait(time.Second)
				}
				continue
			}
			listedAt, ended = time.Now(), false
		}
		var round []meterledger.Record
		var keys []meterledger.MeterKey
		for len(queue) > 0 && len(round) < min(c.cfg.Workers, width-len(inflight)) {
			r := queue[0]
			queue = queue[1:]
			if k := keyOf(r); !inflight[k] {
				inflight[k] = true
				round, keys = append(round, r), append(keys, k)
			}
		}
		if len(round) > 0 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n, next, err := c.sendRound(ctx, round)
				switch {
				case err != nil && ctx.Err() == nil:
					c.cfg.Logger.Warn("sending meter events from the ledger", "stream", c.cfg.Stream, "err", err)
					sleep(ctx, time.Second)
				case n == 0:
					// Nothing sent (another consumer got there first, a
					// refusal before the call): not listed again at once.
					sleep(ctx, ownRevisitIdle)
				}
				done <- roundEnd{keys: keys, next: next}
			}()
		}
		// Until a round ends, or for a while: new events, or slots another
		// consumer freed, are listed then.
		if len(round) == 0 || len(inflight) >= width {
			wait(senderRelist)
		}
		for drained := false; !drained; {
			select {
			case e := <-done:
				free(e)
			default:
				drained = true
			}
		}
	}
}

// roundEnd is a round's end: its customer-meters, and what to do next
// with them.
type roundEnd struct {
	keys []meterledger.MeterKey
	next roundNext
}

// hotFor is how long a customer-meter stays hot after its last aggregate
// of at least hotMembers events; hotMax bounds how many are listed ahead of
// older work (the most recent).
const (
	hotFor = 10 * time.Second
	hotMax = 32
)

// hotKeys forgets the customer-meters of hot no longer hot at now and
// returns up to hotMax of the others, the most recent first.
func hotKeys(hot map[meterledger.MeterKey]time.Time, now time.Time) []meterledger.MeterKey {
	keys := make([]meterledger.MeterKey, 0, len(hot))
	for k, at := range hot {
		if now.Sub(at) > hotFor {
			delete(hot, k)
			continue
		}
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b meterledger.MeterKey) int { return hot[b].Compare(hot[a]) })
	return keys[:min(len(keys), hotMax)]
}

// minRound is the fewest customer-meters a round starts with while others
// are in flight (sendLoop).
func minRound(workers int) int { return max(workers/2, 1) }

// list reads the ledger's floor when floorEvery has passed and lists up
// to limit candidates from it into queue.
func (c *MeterConsumer) list(ctx context.Context, from *meterledger.ListFrom, floor, floorAt *time.Time,
	queue *[]meterledger.Record, limit int) error {
	if time.Since(*floorAt) > floorEvery {
		// What ingest lowers from now on is kept: read after the reset.
		c.ingestedFrom.Store(math.MaxInt64)
		f, err := c.ledger.UnsentFloor(ctx, c.cfg.Stream)
		if err != nil {
			return err
		}
		*floor, *floorAt = f, time.Now()
		c.listFloor.Store(f.UnixNano())
	}
	from.Floor = *floor
	if n := c.ingestedFrom.Load(); n < floor.UnixNano() {
		from.Floor = time.Unix(0, n).UTC()
	}
	cands, err := c.candidates(ctx, limit, from)
	if err != nil {
		return err
	}
	*queue = cands
	return nil
}

// freshenStats analyzes, every statsEvery until ctx ends, the partitions
// the sender reads (from its floor's day on) whose planner statistics are
// stale: a listing planned on a freshly filled day's partition reads every
// queued row of it (meterledger.FreshenStats).
func (c *MeterConsumer) freshenStats(ctx context.Context) {
	for sleep(ctx, statsEvery); ctx.Err() == nil; sleep(ctx, statsEvery) {
		f := c.listFloor.Load()
		if f == 0 {
			continue // nothing listed yet
		}
		names, err := c.ledger.FreshenStats(ctx, time.Unix(0, f))
		switch {
		case err != nil && ctx.Err() == nil:
			c.cfg.Logger.Warn("analyzing meter event partitions", "err", err)
		case len(names) > 0:
			c.cfg.Logger.Debug("analyzed meter event partitions", "partitions", names)
		}
	}
}

// candidates lists the customer-meters to send next, the oldest unsent
// event first, an aggregated meter only once a bucket of it is ready.
func (c *MeterConsumer) candidates(ctx context.Context, limit int, from *meterledger.ListFrom) ([]meterledger.Record, error) {
	var mark time.Time
	if len(c.cfg.AggregateMeters) > 0 {
		m, err := watermark.Read(ctx, c.cfg.Redis, c.cfg.Stream, c.cfg.Group)
		if err != nil {
			return nil, err
		}
		// Buckets of the meters' width (FormAggregate): ready once the
		// watermark, aligned down to the width, has passed their end.
		mark = readyBefore(m.Time(), c.cfg.AggregateBucket)
	}
	return c.ledger.Candidates(ctx, c.cfg.Stream, limit, c.cfg.AggregateMeters, mark, from)
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
	n, _, err := c.sendRound(ctx, recs)
	return na + n, err
}

// sendRound sends recs, one customer-meter each: a queued event of an
// aggregated meter as its customer-meter's next ready aggregate, any other
// as itself. It returns how many calls it made, and what the sender does
// next with its customer-meters (formAndSend).
func (c *MeterConsumer) sendRound(ctx context.Context, recs []meterledger.Record) (int, roundNext, error) {
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
	var na int
	var next roundNext
	if len(forms) > 0 {
		n, nx, err := c.formAndSend(ctx, forms)
		na, next = na+n, nx
		if err != nil {
			return na, next, err
		}
	}
	n, err := c.sendEvents(ctx, perEvent)
	return na + n, next, err
}

// sendEvents sends recs one call each (Reserve: the same decisions and
// fences as a per-event send from the stream, an unknown outcome taken
// over within the safe window and parked past it), records the outcomes,
// witnesses them and dead-letters refusals from the ledger's copy of their
// entries. It returns how many calls it made.
func (c *MeterConsumer) sendEvents(ctx context.Context, recs []meterledger.Record) (int, error) {
	if len(recs) == 0 {
		return 0, nil
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
	return len(send), c.settle(dctx, nil, dead, nil, &b)
}
