package reaper

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/meterwitness"
)

// Meter-event streams (`pelguard-consumer meter-events`, DESIGN.md "Usage to
// Stripe Billing Meters"): the same pass over idle pending entries, decided
// against the meter ledger (meter_events) before any claim. An entry whose
// event is recorded delivered or refused is acked without a call (a
// partial batch, a consumer killed before XACK, an AOF rollback); one
// parked (or settled as not counted since) is re-driven to be
// dead-lettered with its reason, not sent; one
// whose event is in flight under a live lease is left alone (reclaim while
// in flight); the rest are claimed with the min-idle fence and re-driven
// through the meter consumer's own processing, whose reservation decides
// again, atomically, whether Stripe may be called. The delivery count is
// not a limit here: a live consumer re-reads entries whose customer meter
// is busy, and an event of unknown outcome ends parked by its age, not by
// its deliveries.

// meterStream is one meter-event stream the reaper tends.
type meterStream struct {
	*streamState
	cons *consumer.MeterConsumer // nil in dry run
}

// newMeterStreams builds the re-drive consumers of Config.MeterStreams,
// acting under the reaper's own consumer name.
func (r *Reaper) newMeterStreams() error {
	if len(r.cfg.MeterStreams) == 0 {
		return nil
	}
	l, err := meterledger.New(r.cfg.DB, meterledger.Config{Schema: r.cfg.Schema, Clock: r.cfg.Clock, SafeWindow: r.cfg.MeterSafeWindow})
	if err != nil {
		return fmt.Errorf("reaper: %w", err)
	}
	r.meterLedger = l
	for _, sg := range r.cfg.MeterStreams {
		ms := &meterStream{streamState: &streamState{StreamGroup: sg}}
		if !r.cfg.DryRun {
			c, err := consumer.NewMeterConsumer(consumer.MeterConfig{
				Redis: r.cfg.Redis, DB: r.cfg.DB, Schema: r.cfg.Schema, Stripe: r.cfg.MeterStripe,
				Stream: sg.Stream, Group: sg.Group, Name: r.cfg.Name, Namespace: r.cfg.Namespace,
				Lease: r.cfg.Lease, Rules: r.cfg.MeterRules, SafeWindow: r.cfg.MeterSafeWindow,
				Witness: r.cfg.Witness, Metrics: r.cfg.ConsumerMetrics, Notifier: r.cfg.Notifier,
				Logger: r.cfg.Logger, Clock: r.cfg.Clock,
			})
			if err != nil {
				return fmt.Errorf("reaper: building the re-drive for meter stream %s: %w", sg, err)
			}
			ms.cons = c
		}
		r.meters = append(r.meters, ms)
	}
	return nil
}

// meterInput is everything decideMeterEntry looks at for one pending entry.
type meterInput struct {
	Pending  redis.XPendingExt
	InFlight bool
	Gone     bool
	// Event and Identifier are the parsed body; Invalid is its rejection
	// when it did not parse.
	Event      event.MeterEvent
	Identifier string
	Invalid    *event.RejectError
	// Replay: the entry is an operator's replay of a dead letter.
	Replay bool
	Row    meterledger.Record
	HasRow bool
	Now    time.Time
}

// decideMeterEntry is the reaper's decision table for a meter-event entry,
// checked in order. Pure, like decideEntry (decide_test.go tests both).
func decideMeterEntry(in meterInput) verdict {
	switch {
	case in.InFlight:
		return verdict{Kind: KindInFlight}
	case in.Gone:
		return verdict{Kind: KindGone}
	case in.Invalid != nil:
		return verdict{Kind: KindInvalid, Reason: in.Invalid.Reason, Detail: in.Invalid.Error()}
	}
	rec := in.Row
	v := verdict{Key: meterledger.KeyOf(in.Event, in.Identifier).String()}
	switch {
	case in.HasRow && in.Replay && (rec.Status == meterledger.StatusFailed || rec.Status == meterledger.StatusParked):
		// An operator's replay of a refused or parked event: its
		// reservation reopens the row and sends it.
		v.Kind, v.Reason = KindClaim, "replay of a "+string(rec.Status)+" meter event"
	case in.HasRow && rec.Status != meterledger.StatusSending:
		if rec.EventName != in.Event.EventName || rec.StripeCustomerID != in.Event.StripeCustomerID || rec.Value != in.Event.Value {
			// Another event under this identifier: never send it, never drop
			// it silently either.
			v.Kind, v.Reason = KindConflict, consumer.ReasonConflict
			v.Detail = fmt.Sprintf("the meter ledger has %s %s for %s (value %d) under %s; this entry says %s for %s (value %d)",
				rec.Status, rec.EventName, rec.StripeCustomerID, rec.Value, in.Identifier,
				in.Event.EventName, in.Event.StripeCustomerID, in.Event.Value)
			return v
		}
		if rec.LeftToAPerson() {
			// Of unknown outcome (parked before it was acked, by the usage
			// repair, which writes no dead letter), or settled as not
			// counted since: the re-drive dead-letters it with the row's
			// reason and sends nothing, so that a person can settle it and
			// replay it.
			v.Kind, v.Reason = KindClaim, "meter event "+string(rec.Status)+" and left to a person: dead-lettered with its reason, not sent"
			return v
		}
		// Delivered or refused: nothing more may be sent for it.
		v.Kind, v.Reason = KindAlreadyBilled, "meter event "+string(rec.Status)
	case in.HasRow && rec.LeaseLive(in.Now):
		v.Kind = KindLeaseLive
		v.Reason = fmt.Sprintf("lease held by %s until %s", rec.LeaseOwner, rec.LeaseExpiresAt.UTC().Format(time.RFC3339Nano))
	default:
		// No row (its consumer died before reserving) or a lapsed lease:
		// the re-drive's reservation decides (re-send within the safe
		// window, park past it).
		v.Kind = KindClaim
		if in.HasRow {
			v.Reason = fmt.Sprintf("lease of %s lapsed at %s", rec.LeaseOwner, rec.LeaseExpiresAt.UTC().Format(time.RFC3339Nano))
		}
	}
	return v
}

// reapMeterStream pages through one meter stream's idle pending entries and
// decides each page in turn.
func (r *Reaper) reapMeterStream(ctx, workCtx context.Context, ms *meterStream, p *pass, wg *sync.WaitGroup) error {
	start := "-"
	for ctx.Err() == nil {
		pend, err := r.cfg.Redis.XPendingExt(ctx, &redis.XPendingExtArgs{
			Stream: ms.Stream, Group: ms.Group, Idle: r.cfg.MinIdle, Start: start, End: "+", Count: r.cfg.PageSize,
		}).Result()
		if redis.HasErrorPrefix(err, "NOGROUP") {
			r.cfg.Logger.WarnContext(ctx, "reaper: no such meter stream or group; nothing to reap",
				"stream", ms.Stream, "group", ms.Group)
			return nil
		}
		if err != nil {
			return fmt.Errorf("XPENDING IDLE %s from %s: %w", r.cfg.MinIdle, start, err)
		}
		if len(pend) == 0 {
			return nil
		}
		p.mu.Lock()
		p.sum.Scanned += len(pend)
		p.mu.Unlock()
		if err := r.meterPage(ctx, workCtx, ms, pend, p, wg); err != nil {
			return err
		}
		if int64(len(pend)) < r.cfg.PageSize {
			return nil
		}
		start = "(" + pend[len(pend)-1].ID
	}
	return ctx.Err()
}

// meterPage fetches a page's bodies and ledger rows (one query), decides
// every entry, and acts: one XACK, fenced dead letters, one fenced XCLAIM
// for the claims, then their re-drive.
func (r *Reaper) meterPage(ctx, workCtx context.Context, ms *meterStream, pend []redis.XPendingExt, p *pass, wg *sync.WaitGroup) error {
	if r.paused(ms.StreamGroup) {
		return nil // paused during the pass: left for the resume
	}
	now := r.cfg.Clock.Now()
	entries := make([]*entry, 0, len(pend))
	for _, pe := range pend {
		if r.isInFlight(ms.Stream, pe.ID) {
			r.record(p, r.decision(ms.streamState, pe, decideMeterEntry(meterInput{Pending: pe, InFlight: true})))
			continue
		}
		entries = append(entries, &entry{pe: pe})
	}
	if len(entries) == 0 {
		return nil
	}
	inputs, err := r.meterInputs(ctx, ms, entries, now)
	if err != nil {
		return err
	}
	var acks []Decision
	var dead []deadLetter
	var claims []*entry
	var rows []meterledger.Record // of the acks: witnessed before the XACK
	for i, e := range entries {
		e.v = decideMeterEntry(inputs[i])
		d := r.decision(ms.streamState, e.pe, e.v)
		switch e.v.Kind {
		case KindGone, KindAlreadyBilled:
			acks = append(acks, d)
			if inputs[i].HasRow {
				rows = append(rows, inputs[i].Row)
			}
		case KindInvalid, KindConflict:
			dead = append(dead, deadLetter{d: d, msg: e.msg, detail: e.v.Detail})
		case KindClaim:
			claims = append(claims, e)
		default: // KindLeaseLive
			r.record(p, d)
		}
	}
	if err := r.witnessAcks(ctx, ms, rows); err != nil {
		return err // nothing acked: the next pass decides again
	}
	if err := r.ackAll(ctx, ms.streamState, acks, p); err != nil {
		return err
	}
	if err := r.deadLetterAll(ctx, ms.streamState, dead, p); err != nil {
		return err
	}
	return r.claimMeters(ctx, workCtx, ms, claims, p, wg)
}

// witnessAcks writes the meter witness of rows (delivered and parked ones)
// before their entries are acked: the usage repair restores a delivered
// row a ledger rollback lost from this witness only, so an ack without it
// would leave the customer's ledger short of Stripe for good. Pruned as the
// consumers prune it, never while a rollback is unrepaired.
func (r *Reaper) witnessAcks(ctx context.Context, ms *meterStream, rows []meterledger.Record) error {
	if r.cfg.DryRun || r.cfg.Witness == nil {
		return nil
	}
	var sent []meterwitness.Sent
	for _, rec := range rows {
		if rec.Status != meterledger.StatusDelivered && rec.Status != meterledger.StatusParked && rec.Status != meterledger.StatusQueued {
			continue // a queued row (sent from the ledger) is witnessed too: the repair restores it
		}
		sent = append(sent, meterwitness.Sent{Status: string(rec.Status), EventTS: rec.EventTS, Identifier: rec.Identifier,
			EventName: rec.EventName, StripeCustomerID: rec.StripeCustomerID, CustomerID: rec.CustomerID, Value: rec.Value,
			FirstSentAt: rec.FirstSentAt, MessageID: rec.StreamMessageID, Reason: rec.LastError})
	}
	if len(sent) == 0 {
		return nil
	}
	id, err := r.meterLedger.LedgerID(ctx)
	if err != nil {
		return fmt.Errorf("writing the meter witness: %w", err)
	}
	return meterwitness.Record(ctx, r.cfg.Redis, id, meterwitness.Stream{Stream: ms.Stream, Group: ms.Group, Namespace: r.cfg.Namespace},
		sent, r.cfg.Clock.Now(), !r.cfg.Witness.Suspect())
}

// meterInputs reads what decideMeterEntry needs for entries (in id
// order): their bodies in one range read, parsed, and their rows in
// meter_events in one query.
func (r *Reaper) meterInputs(ctx context.Context, ms *meterStream, entries []*entry, now time.Time) ([]meterInput, error) {
	bodies, err := r.bodies(ctx, ms.streamState, entries)
	if err != nil {
		return nil, err
	}
	inputs := make([]meterInput, 0, len(entries))
	var keys []meterledger.Key
	var keyed []int // index into inputs of each key
	for _, e := range entries {
		in := meterInput{Pending: e.pe, Now: now}
		msg, ok := bodies[e.pe.ID]
		if !ok {
			e.gone, in.Gone = true, true
		} else {
			e.msg, in.Replay = msg, consumer.IsReplay(msg.Values)
			ev, err := event.ParseMeterFields(msg.Values, r.cfg.MeterRules, now)
			var rej *event.RejectError
			switch {
			case errors.As(err, &rej):
				in.Invalid = rej
			case err != nil:
				in.Invalid = &event.RejectError{Reason: event.ReasonNotJSON, Detail: err.Error()}
			default:
				in.Event, in.Identifier = ev, ev.Identifier(r.cfg.Namespace)
				keys = append(keys, meterledger.KeyOf(ev, in.Identifier))
				keyed = append(keyed, len(inputs))
			}
		}
		inputs = append(inputs, in)
	}
	recs, found, err := r.meterLedger.Lookup(ctx, keys)
	if err != nil {
		return nil, err
	}
	for i, at := range keyed {
		inputs[at].Row, inputs[at].HasRow = recs[i], found[i]
	}
	return inputs, nil
}

// explainMeter is Explain for a meter stream: meterInputs and
// decideMeterEntry, acting on nothing.
func (r *Reaper) explainMeter(ctx context.Context, ms *meterStream, pend []redis.XPendingExt) ([]Explanation, error) {
	if len(pend) == 0 {
		return nil, nil
	}
	now := r.cfg.Clock.Now()
	items := make([]entry, len(pend))
	entries := make([]*entry, len(pend))
	for i, pe := range pend {
		items[i].pe = pe
		entries[i] = &items[i]
	}
	// XRANGE over the span needs the page in id order.
	sorted := append([]*entry(nil), entries...)
	slices.SortFunc(sorted, func(a, b *entry) int { return compareIDs(a.pe.ID, b.pe.ID) })
	inputs, err := r.meterInputs(ctx, ms, sorted, now)
	if err != nil {
		return nil, err
	}
	byID := make(map[string]meterInput, len(inputs))
	for _, in := range inputs {
		byID[in.Pending.ID] = in
	}
	out := make([]Explanation, len(entries))
	for i, e := range entries {
		in := byID[e.pe.ID]
		in.InFlight = r.isInFlight(ms.Stream, e.pe.ID)
		v := decideMeterEntry(in)
		d := r.decision(ms.streamState, e.pe, v)
		d.Time, d.DryRun = now, true
		// Liveness plays no part in a meter verdict: the ledger's lease does.
		x := Explanation{Decision: d, Detail: v.Detail, Due: e.pe.Idle >= r.cfg.MinIdle, Registered: true}
		if in.HasRow {
			rec := in.Row
			x.Row = &RowState{CustomerID: rec.StripeCustomerID, Status: string(rec.Status), Meter: rec.EventName, Units: rec.Value,
				LeaseOwner: rec.LeaseOwner, LeaseExpiresAt: rec.LeaseExpiresAt, LeaseLive: rec.LeaseLive(now), Attempts: rec.Attempts}
		}
		out[i] = x
	}
	return out, nil
}

// claimMeters claims entries with the min-idle fence in one XCLAIM and
// re-drives those it got, as one batch on a worker slot of their own.
func (r *Reaper) claimMeters(ctx, workCtx context.Context, ms *meterStream, claims []*entry, p *pass, wg *sync.WaitGroup) error {
	if len(claims) == 0 {
		return nil
	}
	if r.cfg.DryRun {
		for _, e := range claims {
			r.record(p, r.decision(ms.streamState, e.pe, e.v))
		}
		return nil
	}
	select {
	case r.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	ids := make([]string, len(claims))
	for i, e := range claims {
		ids[i] = e.pe.ID
	}
	msgs, err := r.cfg.Redis.XClaim(ctx, &redis.XClaimArgs{
		Stream: ms.Stream, Group: ms.Group, Consumer: r.cfg.Name, MinIdle: r.cfg.MinIdle, Messages: ids,
	}).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		<-r.slots
		for _, e := range claims {
			d := r.decision(ms.streamState, e.pe, e.v)
			d.Kind, d.Error = KindError, err.Error()
			r.record(p, d)
		}
		return fmt.Errorf("XCLAIM %d meter events: %w", len(ids), err)
	}
	got := make(map[string]bool, len(msgs))
	for _, m := range msgs {
		got[m.ID] = true
	}
	var mine []*entry
	for _, e := range claims {
		d := r.decision(ms.streamState, e.pe, e.v)
		if !got[e.pe.ID] {
			// The fence held: its owner read it again, another reaper
			// claimed it, or it was acked meanwhile.
			d.Kind = KindClaimLost
		} else {
			mine = append(mine, e)
			r.setInFlight(ms.Stream, e.pe.ID, true)
		}
		r.record(p, d)
	}
	if len(mine) == 0 {
		<-r.slots
		return nil
	}
	r.cfg.Metrics.inFlight(float64(len(mine)))
	r.redrives.Add(1)
	if wg != nil {
		wg.Add(1)
	}
	go func() {
		defer func() {
			for _, e := range mine {
				r.setInFlight(ms.Stream, e.pe.ID, false)
			}
			r.cfg.Metrics.inFlight(-float64(len(mine)))
			<-r.slots
			r.redrives.Done()
			if wg != nil {
				wg.Done()
			}
		}()
		b, err := ms.cons.Redrive(workCtx, msgs)
		for _, e := range mine {
			rd := r.decision(ms.streamState, e.pe, e.v)
			rd.Time, rd.Kind = r.cfg.Clock.Now(), KindRedriven
			rd.Outcome = b.Outcomes[e.pe.ID]
			if rd.Outcome == "" {
				rd.Outcome = consumer.OutcomeRetryLater
			}
			if err != nil {
				rd.Error = err.Error()
			}
			r.cfg.Metrics.redrive(rd.Outcome)
			r.record(p, rd)
		}
	}()
	return nil
}
