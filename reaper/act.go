package reaper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/stripeapi"
)

func (r *Reaper) base(st *streamState, pe redis.XPendingExt, kind Kind) Decision {
	return Decision{Time: r.cfg.Clock.Now(), Stream: st.Stream, Group: st.Group, ID: pe.ID,
		Consumer: pe.Consumer, Idle: pe.Idle, Deliveries: pe.RetryCount, Kind: kind, DryRun: r.cfg.DryRun}
}

// decision is the account of verdict v for pe.
func (r *Reaper) decision(st *streamState, pe redis.XPendingExt, v verdict) Decision {
	d := r.base(st, pe, v.Kind)
	d.Key, d.Reason = v.Key, v.Reason
	return d
}

func (r *Reaper) record(p *pass, d Decision) {
	p.add(d)
	r.decide(d)
}

// act carries out a page's verdicts: skips are recorded, acks go in one
// XACK, dead letters behind one fencing XCLAIM, and claims are claimed and
// re-driven one by one.
func (r *Reaper) act(ctx, workCtx context.Context, st *streamState, entries []*entry, p *pass, wg *sync.WaitGroup) error {
	var acks []Decision
	var dead []deadLetter
	var claims []*entry
	for _, e := range entries {
		switch e.v.Kind {
		case KindGone, KindAlreadyBilled:
			acks = append(acks, r.decision(st, e.pe, e.v))
		case KindInvalid, KindConflict, KindMaxDeliveries:
			dead = append(dead, deadLetter{d: r.decision(st, e.pe, e.v), msg: e.msg, detail: e.v.Detail})
		case KindClaim:
			claims = append(claims, e)
		case KindLeaseLive, KindInFlight:
			r.record(p, r.decision(st, e.pe, e.v))
		case KindUnregistered:
			st.noteUnregistered(e.pe.Consumer)
			r.record(p, r.decision(st, e.pe, e.v))
		default:
			return fmt.Errorf("reaper: no action for %s's decision %q", e.pe.ID, e.v.Kind)
		}
	}
	if err := r.ackAll(ctx, st, acks, p); err != nil {
		return err
	}
	if err := r.deadLetterAll(ctx, st, dead, p); err != nil {
		return err
	}
	for _, e := range claims {
		if err := r.claim(ctx, workCtx, st, e, p, wg); err != nil {
			return err
		}
	}
	return nil
}

// ackAll acks gone and already-billed entries in one XACK. No fence is
// needed: a gone entry can never be processed, and a terminal ledger row
// forbids any further Stripe call whoever holds the entry.
func (r *Reaper) ackAll(ctx context.Context, st *streamState, acks []Decision, p *pass) error {
	if len(acks) == 0 {
		return nil
	}
	if !r.cfg.DryRun {
		ids := make([]string, len(acks))
		for i, d := range acks {
			ids[i] = d.ID
		}
		if err := r.cfg.Redis.XAck(ctx, st.Stream, st.Group, ids...).Err(); err != nil {
			for _, d := range acks {
				d.Kind, d.Error = KindError, err.Error()
				r.record(p, d)
			}
			return fmt.Errorf("XACK %d entries: %w", len(ids), err)
		}
		var gone []string
		for _, d := range acks {
			if d.Kind == KindGone {
				gone = append(gone, d.ID)
			}
		}
		st.noteGone(gone)
	}
	for _, d := range acks {
		r.record(p, d)
	}
	return nil
}

type deadLetter struct {
	d      Decision
	msg    redis.XMessage
	detail string
}

// deadLetterAll claims (with the min-idle fence, so an entry a heartbeat
// just renewed is left to its owner) and dead-letters entries that must not
// be charged.
func (r *Reaper) deadLetterAll(ctx context.Context, st *streamState, dead []deadLetter, p *pass) error {
	if len(dead) == 0 {
		return nil
	}
	if r.cfg.DryRun {
		for _, dl := range dead {
			r.record(p, dl.d)
		}
		return nil
	}
	ids := make([]string, len(dead))
	for i, dl := range dead {
		ids[i] = dl.d.ID
	}
	claimed, err := r.cfg.Redis.XClaimJustID(ctx, &redis.XClaimArgs{
		Stream: st.Stream, Group: st.Group, Consumer: r.cfg.Name, MinIdle: r.cfg.MinIdle, Messages: ids,
	}).Result()
	if err != nil {
		return fmt.Errorf("claiming %d entries to dead-letter: %w", len(ids), err)
	}
	got := make(map[string]bool, len(claimed))
	for _, id := range claimed {
		got[id] = true
	}
	var (
		mine  []deadLetter
		batch []consumer.Dead
	)
	for _, dl := range dead {
		if !got[dl.d.ID] {
			d := dl.d
			d.Kind, d.Reason = KindClaimLost, "dead letter fenced off: "+d.Reason
			r.record(p, d)
			continue
		}
		mine = append(mine, dl)
		batch = append(batch, consumer.Dead{Msg: dl.msg, Reason: dl.d.Reason, Detail: dl.detail})
	}
	if len(batch) == 0 {
		return nil
	}
	errs := consumer.DeadLetterMany(ctx, r.cfg.Redis, st.Stream, st.Group, r.cfg.Name, batch, r.cfg.Clock.Now())
	for i, dl := range mine {
		d := dl.d
		if errs[i] != nil {
			d.Kind, d.Error = KindError, errs[i].Error()
			r.record(p, d)
			continue
		}
		// max_deliveries has a reaper_anomaly alert of its own: one
		// event, one Slack message.
		if r.cfg.DeadLetters != nil && d.Kind != KindMaxDeliveries {
			r.cfg.DeadLetters.Add(st.Stream, d.Reason, d.ID, consumer.CustomerOf(dl.msg))
		}
		if d.Kind == KindMaxDeliveries {
			r.cfg.Notifier.Notify(alerts.ReaperAnomaly("max_deliveries", st.Stream, st.Group, d.Consumer, d.ID, dl.detail))
		}
		r.record(p, d)
	}
	return nil
}

// claim takes a worker slot, claims the entry with the min-idle fence, and
// re-drives it through the consumer's Processor on its own goroutine.
func (r *Reaper) claim(ctx, workCtx context.Context, st *streamState, e *entry, p *pass, wg *sync.WaitGroup) error {
	d := r.decision(st, e.pe, e.v)
	if r.cfg.DryRun {
		r.record(p, d)
		return nil
	}
	if r.paused(st.StreamGroup) {
		return nil // paused during the pass: left for the resume
	}
	// Take the slot before claiming: a claimed entry waiting for a worker
	// would sit unheld, and its idle time would run towards another claim.
	select {
	case r.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	msgs, err := r.cfg.Redis.XClaim(ctx, &redis.XClaimArgs{
		Stream: st.Stream, Group: st.Group, Consumer: r.cfg.Name, MinIdle: r.cfg.MinIdle, Messages: []string{e.pe.ID},
	}).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		<-r.slots
		d.Kind, d.Error = KindError, err.Error()
		r.record(p, d)
		return fmt.Errorf("XCLAIM %s: %w", e.pe.ID, err)
	}
	if len(msgs) == 0 || msgs[0].ID != e.pe.ID {
		// The fence held: a heartbeat reset the idle time, another reaper
		// claimed it, or it was acked or deleted meanwhile.
		<-r.slots
		d.Kind = KindClaimLost
		r.record(p, d)
		return nil
	}
	r.record(p, d)
	r.setInFlight(st.Stream, e.pe.ID, true)
	r.cfg.Metrics.inFlight(1)
	r.redrives.Add(1)
	if wg != nil {
		wg.Add(1)
	}
	go func() {
		defer func() {
			r.setInFlight(st.Stream, e.pe.ID, false)
			r.cfg.Metrics.inFlight(-1)
			<-r.slots
			r.redrives.Done()
			if wg != nil {
				wg.Done()
			}
		}()
		// The re-driven event's pelguard.event span is this one's child.
		ctx, span := r.tracer.Start(workCtx, "pelguard.redrive", trace.WithAttributes(
			attribute.String("pelguard.stream", st.Stream), attribute.String("pelguard.message_id", e.pe.ID),
			attribute.Int64("pelguard.deliveries", e.pe.RetryCount), attribute.String("pelguard.decision", string(d.Kind))))
		var out consumer.Outcome
		var err error
		if r.team != nil {
			out, err = r.externalRedrive(ctx, st, msgs[0])
		} else {
			out, err = st.proc.Process(ctx, st.Stream, msgs[0])
		}
		span.SetAttributes(attribute.String("pelguard.outcome", string(out)))
		if err != nil {
			span.SetStatus(codes.Error, string(out)) // not err's text: it may quote a request
		}
		span.End()
		rd := d
		rd.Time, rd.Kind, rd.Outcome = r.cfg.Clock.Now(), KindRedriven, out
		if out == consumer.OutcomeRetryLater && errors.Is(err, stripeapi.ErrTransient) {
			// Stripe down, throttling or timing out says nothing about the
			// event: do not let it count towards MaxDeliveries. Any other
			// cause of retry_later (a ledger write, a 403 on the look-up)
			// still counts, so a lasting one ends in a dead letter and an
			// alert rather than a re-drive every --min-idle forever.
			err = errors.Join(err, r.uncount(workCtx, st, e.pe))
		}
		if err != nil {
			rd.Error = err.Error()
		}
		r.cfg.Metrics.redrive(out)
		r.record(p, rd)
	}()
	return nil
}

// uncount gives pe back the delivery count it had before this reaper's
// claim (see uncount.lua).
func (r *Reaper) uncount(ctx context.Context, st *streamState, pe redis.XPendingExt) error {
	// Shutdown cancels ctx; the restore is one short script, let it land.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := uncountScript.Run(ctx, r.cfg.Redis, []string{st.Stream}, st.Group, r.cfg.Name, pe.ID, pe.RetryCount).Err()
	if err != nil {
		return fmt.Errorf("restoring the delivery count of %s after a transient failure: %w", pe.ID, err)
	}
	return nil
}
