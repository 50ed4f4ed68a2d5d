package consumer

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/meterwitness"
	"github.com/pelguard/pelguard/internal/watermark"
	"github.com/pelguard/pelguard/stripeapi"
)

// Aggregates of sum meters (MeterConfig.AggregateMeters): one call carries
// the sum of a customer-meter's queued events of one bucket of
// MeterConfig.AggregateBucket (a second by default) that arrived in one
// arrival bucket, formed once the group's ingest
// watermark has passed the bucket (so its members are fixed by the
// stream), under an identifier saved with its members before the first
// call (meterledger.FormAggregate) and witnessed before it, so a re-send
// after a crash, a lost reply or a ledger rollback — of Redis too — is the
// same call.

type aggWork struct {
	agg     meterledger.Aggregate
	out     meterledger.Outcome
	keyErr  error
	missing bool
	paused  bool // paused before its call: not sent
	// cand is the sender's candidate it was formed for (none for a
	// takeover); more: its customer-meter had another bucket ready then.
	cand meterledger.Record
	more bool
}

// sendAggregates takes over and re-sends stale aggregates of the stream
// (their holder gone, outcome unknown) within the safe window, and parks
// them with their members past it.
func (c *MeterConsumer) sendAggregates(ctx context.Context) (int, error) {
	stale, err := c.ledger.StaleAggregates(ctx, c.cfg.Stream, c.cfg.Workers)
	if err != nil || len(stale) == 0 {
		return 0, err
	}
	var work []*aggWork
	var dead []Dead
	var sent []meterwitness.Sent
	for _, s := range stale {
		d, a, reason, err := c.ledger.TakeOverAggregate(ctx, s, c.cfg.Name, c.cfg.Lease)
		if err != nil {
			return 0, err
		}
		switch d {
		case meterledger.TakenOver:
			work = append(work, &aggWork{agg: a})
		case meterledger.Parked:
			members, err := c.ledger.MembersOf(ctx, a)
			if err != nil {
				return 0, err
			}
			c.cfg.Notifier.Notify(alerts.MeterEventParked(a.EventName, a.StripeCustomerID, a.Identifier, a.Value, reason))
			for _, m := range members {
				sent = append(sent, sentOfRecord(m, meterledger.StatusParked, reason))
				dead = append(dead, Dead{Msg: msgOf(m), Reason: ReasonMeterParked, Detail: reason})
				c.cfg.Metrics.event(c.cfg.Stream, OutcomeParked)
			}
		}
	}
	// A taken-over aggregate is witnessed again before its call: its first
	// holder may have died before witnessing it (then it was never sent).
	aggs := make([]meterledger.Aggregate, len(work))
	for i, w := range work {
		aggs[i] = w.agg
	}
	members, err := c.ledger.MembersOfAll(ctx, aggs)
	if err != nil {
		return 0, err
	}
	var wit []meterwitness.Sent
	for _, w := range work {
		wit = append(wit, aggregateWitness(w.agg, members[w.agg.Identifier]))
	}
	if len(wit) > 0 {
		dctx, cancel := detach(ctx)
		err := c.recordSent(dctx, wit)
		cancel()
		if err != nil {
			return 0, err // not sent: taken over again once the lease lapses
		}
	}
	return c.finishAggregates(ctx, work, dead, sent)
}

// aggregateWitness is the meter witness of aggregate a with its members.
func aggregateWitness(a meterledger.Aggregate, members []meterledger.Record) meterwitness.Sent {
	ids := make([]string, len(members))
	for i, m := range members {
		ids[i] = m.Identifier
	}
	return meterwitness.Sent{Status: meterwitness.Aggregate, EventTS: a.Second, Identifier: a.Identifier, EventName: a.EventName,
		StripeCustomerID: a.StripeCustomerID, Value: a.Value, FirstSentAt: a.FirstSentAt, Members: ids, Digest: a.Digest}
}

// hotMembers is how many events an aggregate carries for its
// customer-meter to be hot: listed ahead of others' older work while it
// keeps sending (meterledger.ListFrom.Hot).
const hotMembers = 10

// roundNext is what a round tells the sender of its customer-meters: the
// candidates of those that delivered an aggregate and have another ready
// (tried again first), and those whose delivered aggregate carried at
// least hotMembers events (hot).
type roundNext struct {
	again []meterledger.Record
	hot   []meterledger.MeterKey
}

// formAndSend forms the aggregate of each candidate's second (one per
// customer-meter), witnesses it, and sends it. It returns the calls made
// and what the sender does next with the candidates' customer-meters.
func (c *MeterConsumer) formAndSend(ctx context.Context, cands []meterledger.Record) (int, roundNext, error) {
	var next roundNext
	if c.paused() {
		return 0, next, nil
	}
	// The group's ingest watermark, read once for the round: a bucket is
	// formed only once it has passed the bucket's end, so its members are
	// fixed by the stream (meterledger.FormAggregate).
	mark, err := watermark.Read(ctx, c.cfg.Redis, c.cfg.Stream, c.cfg.Group)
	if err != nil {
		return 0, next, err
	}
	// The round's candidates are other customer-meters: formed in one
	// transaction. The oldest candidate's day bounds the partitions read.
	keys := make([]meterledger.MeterKey, len(cands))
	candOf := make(map[meterledger.MeterKey]meterledger.Record, len(cands))
	from := cands[0].EventTS
	for i, r := range cands {
		keys[i] = keyOf(r)
		candOf[keys[i]] = r
		if r.EventTS.Before(from) {
			from = r.EventTS
		}
	}
	formed, err := c.ledger.FormAggregates(ctx, meterledger.FormRequest{Namespace: c.cfg.Namespace, Stream: c.cfg.Stream, From: from,
		Watermark: mark.Time(), Width: c.cfg.AggregateBucket, Owner: c.cfg.Name, Lease: c.cfg.Lease}, keys)
	if err != nil {
		return 0, next, err
	}
	var work []*aggWork
	var wit []meterwitness.Sent
	for _, f := range formed {
		a := f.Aggregate
		if !f.Send {
			continue // of unknown outcome: a takeover decides it
		}
		if a.LateJoin {
			// Its events' entries were below the watermark when the bucket
			// was first formed, yet queued after: counted once here, but a
			// rollback of both stores would form the bucket differently.
			c.cfg.Logger.Warn("meter events joined an aggregate bucket formed before; sent as another aggregate",
				"stream", c.cfg.Stream, "identifier", a.Identifier, "event_name", a.EventName, "second", a.Second.Unix(),
				"arrival_second", a.ArrivalSecond, "members", a.Members)
		}
		work = append(work, &aggWork{agg: a, cand: candOf[meterledger.MeterKey{EventName: a.EventName, StripeCustomerID: a.StripeCustomerID}],
			more: f.More})
		wit = append(wit, aggregateWitness(a, f.Members))
	}
	if len(work) == 0 {
		return 0, next, nil
	}
	// The aggregate's identifier and members reach the witness before its
	// first call: a rollback that loses them never has its members sent
	// again on their own. Not witnessed: not sent (a takeover sends it).
	dctx, cancel := detach(ctx)
	defer cancel()
	if err := c.recordSent(dctx, wit); err != nil {
		return 0, next, err
	}
	n, err := c.finishAggregates(ctx, work, nil, nil)
	var now *watermark.Mark // read once, if a hot customer-meter needs it
	for _, w := range work {
		if w.out.Result != meterledger.Delivered {
			continue
		}
		hot := w.agg.Members >= hotMembers
		if w.more || hot && c.nextBucketEnded(ctx, w.agg, &now) {
			next.again = append(next.again, w.cand)
		}
		if hot {
			next.hot = append(next.hot, keyOf(w.cand))
		}
	}
	return n, next, err
}

// nextBucketEnded reports whether the bucket after a's has ended by the
// group's ingest watermark now (read into *mark once): a busy customer
// forms its second before the next one ends, so More (read at forming)
// is false, and the next is ready by the time the call and the recording
// are done. Without it, the busy customer waited for the sender's next
// listing (up to senderStale) every second.
func (c *MeterConsumer) nextBucketEnded(ctx context.Context, a meterledger.Aggregate, mark **watermark.Mark) bool {
	if *mark == nil {
		m, err := watermark.Read(ctx, c.cfg.Redis, c.cfg.Stream, c.cfg.Group)
		if err != nil {
			return false // left to the next listing
		}
		*mark = &m
	}
	return bucketAfterEnded(a.Second, c.cfg.AggregateBucket, (*mark).Time())
}

// bucketAfterEnded reports whether the bucket of width after the one
// starting at second has ended by the watermark mark (readyBefore).
func bucketAfterEnded(second time.Time, width time.Duration, mark time.Time) bool {
	return !readyBefore(mark, width).Before(second.Add(2 * bucketWidth(width)))
}

// readyBefore is the watermark mark aligned down to the bucket width: the
// buckets that end at or before it are ready (FormAggregates forms them).
func readyBefore(mark time.Time, width time.Duration) time.Time {
	w := int64(bucketWidth(width) / time.Second)
	return time.Unix(mark.Unix()/w*w, 0).UTC()
}

// bucketWidth is width as FormAggregates takes it: whole seconds, at least one.
func bucketWidth(width time.Duration) time.Duration {
	return max(width.Truncate(time.Second), time.Second)
}

// finishAggregates sends work (Workers at once), records each outcome with
// its members, witnesses them and dead-letters refusals from the ledger's
// copies of the members' entries. It returns the calls made.
func (c *MeterConsumer) finishAggregates(ctx context.Context, work []*aggWork, dead []Dead, sent []meterwitness.Sent) (int, error) {
	slots := make(chan struct{}, c.cfg.Workers)
	var wg sync.WaitGroup
	for _, w := range work {
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer func() { <-slots; wg.Done() }()
			a := w.agg
			if c.paused() {
				// The operator's pause, checked before each call as the
				// per-event sends do: no call (unformAggregates).
				w.paused = true
				return
			}
			start := time.Now()
			_, err := c.cfg.Stripe.SendMeterEvent(ctx, stripeapi.MeterEvent{EventName: a.EventName, StripeCustomerID: a.StripeCustomerID,
				Value: a.Value, Identifier: a.Identifier, Timestamp: a.Second})
			c.cfg.Metrics.stripeCall(resultClass(err), time.Since(start).Seconds())
			w.out = meterOutcome(meterledger.Hold{}, err)
			if errors.Is(err, stripeapi.ErrAuthentication) || errors.Is(err, stripeapi.ErrPermission) {
				w.keyErr = err
			}
			w.missing = stripeapi.IsMissingMeter(err)
			if w.out.Result == meterledger.Release && !rateLimited(err) {
				c.cfg.Logger.Warn("meter aggregate not confirmed; it is sent again under its identifier",
					"stream", c.cfg.Stream, "identifier", a.Identifier, "err", err)
			}
		}()
	}
	wg.Wait()
	fctx := context.WithoutCancel(ctx)
	results, memberRows, firstErr := c.recordAggregates(fctx, work)
	for i, w := range work {
		res := results[i]
		if res == 0 || res == meterledger.Release {
			continue // not recorded (stays sending, taken over when its lease lapses), or released
		}
		if !c.readsMembers(res) {
			// Delivered with no witness to write: its members are not read.
			c.cfg.Metrics.eventsN(c.cfg.Stream, OutcomeDelivered, w.agg.Members)
			continue
		}
		for _, m := range memberRows[w.agg.Identifier] {
			switch res {
			case meterledger.Delivered:
				sent = append(sent, sentOfRecord(m, meterledger.StatusDelivered, ""))
				c.cfg.Metrics.event(c.cfg.Stream, OutcomeDelivered)
			case meterledger.Park:
				sent = append(sent, sentOfRecord(m, meterledger.StatusParked, m.LastError))
				dead = append(dead, Dead{Msg: msgOf(m), Reason: ReasonMeterParked, Detail: m.LastError})
				c.cfg.Metrics.event(c.cfg.Stream, OutcomeParked)
			case meterledger.Failed:
				reason := ReasonMeterRefused
				if w.keyErr != nil {
					reason = ReasonStripeKey
				}
				dead = append(dead, Dead{Msg: msgOf(m), Reason: reason, Detail: w.out.Reason})
				c.cfg.Metrics.event(c.cfg.Stream, OutcomeFailed)
			}
		}
		switch {
		case res == meterledger.Park:
			c.cfg.Notifier.Notify(alerts.MeterEventParked(w.agg.EventName, w.agg.StripeCustomerID, w.agg.Identifier, w.agg.Value, w.out.Reason))
		case res == meterledger.Failed && w.keyErr != nil:
			c.cfg.Notifier.Notify(alerts.StripeKeyRejected(w.keyErr))
		case res == meterledger.Failed && w.missing:
			c.sayMeterMissing(w.agg.EventName)
		}
	}
	dctx, cancel := detach(ctx)
	defer cancel()
	if len(sent) > 0 {
		if err := c.cfg.Witness.Mirror(dctx); err != nil {
			return 0, err
		}
		if err := c.recordSent(dctx, sent); err != nil {
			return 0, err
		}
	}
	calls := 0
	for _, w := range work {
		if !w.paused {
			calls++
		}
	}
	var b MeterBatch
	return calls, cmp.Or(c.settle(dctx, nil, dead, nil, &b), firstErr)
}

// recordAggregates records work's outcomes (one FinishAggregates for the
// sent, UnformAggregate for each paused) and reads the members of those
// finished. A result is 0 where the hold was lost or the write failed
// (the first error is returned): such an aggregate stays sending, taken
// over when its lease lapses.
func (c *MeterConsumer) recordAggregates(ctx context.Context, work []*aggWork) ([]meterledger.Result, map[string][]meterledger.Record, error) {
	results := make([]meterledger.Result, len(work))
	var outs []meterledger.AggregateOutcome
	var sent []int
	var firstErr error
	for i, w := range work {
		if !w.paused {
			outs, sent = append(outs, meterledger.AggregateOutcome{Aggregate: w.agg, Result: w.out.Result, Reason: w.out.Reason}), append(sent, i)
			continue
		}
		// Never sent: a first attempt is undone (its members queued
		// again, formed again on resume under the same identifier); a
		// taken-over one stays sending, of unknown outcome as it was.
		undone, err := c.ledger.UnformAggregate(ctx, w.agg)
		if err == nil && !undone {
			_, err = c.ledger.FinishAggregate(ctx, w.agg, meterledger.Release, "paused before the call")
		}
		firstErr = cmp.Or(firstErr, err)
		results[i] = meterledger.Release
	}
	got, err := c.ledger.FinishAggregates(ctx, outs)
	if err != nil {
		return results, nil, cmp.Or(firstErr, err)
	}
	// The members of those finished are read for the witness and the
	// dead letters: not those delivered where no witness is kept (a busy
	// customer's second is thousands of rows).
	var finished []meterledger.Aggregate
	for j, i := range sent {
		results[i] = got[j]
		if got[j] != 0 && got[j] != meterledger.Release && c.readsMembers(got[j]) {
			finished = append(finished, work[i].agg)
		}
	}
	members, err := c.ledger.MembersOfAll(ctx, finished)
	if err != nil {
		// Recorded, not witnessed nor dead-lettered: reported; the
		// witness of the aggregate (before its call) still names them.
		return results, nil, cmp.Or(firstErr, err)
	}
	return results, members, firstErr
}

// readsMembers reports whether an aggregate finished with res has its
// members read after it: for their witness, or their dead letters.
func (c *MeterConsumer) readsMembers(res meterledger.Result) bool {
	return res != meterledger.Delivered || c.witnessed
}

// parallel runs fn(0..n-1), at most width at once.
func parallel(width, n int, fn func(i int)) {
	slots := make(chan struct{}, max(width, 1))
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer func() { <-slots; wg.Done() }()
			fn(i)
		}()
	}
	wg.Wait()
}

// sentOfRecord is the meter witness of a member row.
func sentOfRecord(m meterledger.Record, status meterledger.Status, reason string) meterwitness.Sent {
	return meterwitness.Sent{Status: string(status), EventTS: m.EventTS, Identifier: m.Identifier, EventName: m.EventName,
		StripeCustomerID: m.StripeCustomerID, CustomerID: m.CustomerID, Value: m.Value, FirstSentAt: m.FirstSentAt,
		MessageID: m.StreamMessageID, Reason: reason}
}

// msgOf is a row's stream entry as the ledger kept it, for a dead letter.
func msgOf(m meterledger.Record) redis.XMessage {
	msg := redis.XMessage{ID: m.StreamMessageID, Values: meterledger.FieldsOf(m)}
	if msg.Values == nil {
		msg.Values = map[string]any{"identifier": m.Identifier, event.PayloadField: meterledger.EventOf(m).Payload()}
	}
	return msg
}

// paused reports the operator's pause of the stream (MeterConfig.Paused).
func (c *MeterConsumer) paused() bool { return c.cfg.Paused != nil && c.cfg.Paused() }
