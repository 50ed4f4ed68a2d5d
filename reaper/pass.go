package reaper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/event"
	"github.com/pelguard/pelguard/internal/ledger"
)

// pass accumulates one pass's counts; re-drive goroutines add to it after
// the pass itself has returned.
type pass struct {
	mu  sync.Mutex
	sum PassSummary
}

func (p *pass) add(d Decision) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sum.Decisions[d.Kind]++
	if d.Kind == KindRedriven {
		p.sum.Outcomes[d.Outcome]++
	}
}

func (p *pass) summary() PassSummary {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.sum
	s.Decisions = maps.Clone(p.sum.Decisions)
	s.Outcomes = maps.Clone(p.sum.Outcomes)
	return s
}

// runOnce is one pass over every stream. Re-drives run on workCtx and are
// added to wg (when not nil) so RunOnce can wait for them; the loop does not.
func (r *Reaper) runOnce(ctx, workCtx context.Context, wg *sync.WaitGroup) (PassSummary, error) {
	r.passMu.Lock()
	defer r.passMu.Unlock()
	p := &pass{sum: PassSummary{Started: r.cfg.Clock.Now(),
		Decisions: map[Kind]int{}, Outcomes: map[consumer.Outcome]int{}}}
	start := time.Now()
	var errs []error
	for _, st := range r.streams {
		if err := r.reapStream(ctx, workCtx, st, p, wg); err != nil {
			errs = append(errs, fmt.Errorf("reaping %s: %w", st, err))
		}
		if err := r.hygiene(ctx, st, p); err != nil {
			errs = append(errs, fmt.Errorf("consumer hygiene on %s: %w", st, err))
		}
	}
	elapsed := time.Since(start)
	r.cfg.Metrics.passDone(elapsed)
	if wg != nil {
		wg.Wait()
	}
	sum := p.summary()
	sum.Duration = elapsed
	attrs := []any{slog.Int("streams", len(r.streams)), slog.Int("scanned", sum.Scanned),
		slog.Duration("duration", elapsed), slog.Bool("dry_run", r.cfg.DryRun)}
	for k, n := range sum.Decisions {
		attrs = append(attrs, slog.Int(string(k), n))
	}
	err := errors.Join(errs...)
	if err != nil {
		attrs = append(attrs, slog.Any("error", err))
	}
	r.cfg.Logger.InfoContext(ctx, "reaper pass", attrs...)
	return sum, err
}

// reapStream pages through one stream's idle pending entries.
func (r *Reaper) reapStream(ctx, workCtx context.Context, st *streamState, p *pass, wg *sync.WaitGroup) error {
	rdb := r.cfg.Redis
	start := "-"
	var oldest time.Duration
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		pend, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
			Stream: st.Stream, Group: st.Group, Idle: r.cfg.MinIdle,
			Start: start, End: "+", Count: r.cfg.PageSize,
		}).Result()
		if redis.HasErrorPrefix(err, "NOGROUP") {
			// Nothing can be pending in a group that does not exist; say so,
			// since a typo in --stream would otherwise look like a clean PEL.
			r.cfg.Logger.WarnContext(ctx, "reaper: no such stream or group; nothing to reap",
				slog.String("stream", st.Stream), slog.String("group", st.Group))
			return nil
		}
		if err != nil {
			return fmt.Errorf("XPENDING IDLE %s from %s: %w", r.cfg.MinIdle, start, err)
		}
		if len(pend) == 0 {
			break
		}
		for _, pe := range pend {
			oldest = max(oldest, pe.Idle)
		}
		p.mu.Lock()
		p.sum.Scanned += len(pend)
		p.mu.Unlock()
		if err := r.page(ctx, workCtx, st, pend, p, wg); err != nil {
			return err
		}
		if int64(len(pend)) < r.cfg.PageSize {
			break
		}
		// Exclusive start: entries acked above are gone from the PEL, and
		// skipped ones must not be read twice in one pass.
		start = "(" + pend[len(pend)-1].ID
	}
	r.gauges(ctx, st, oldest)
	return nil
}

// gauges sets PEL size and the oldest idle time. When nothing was idle
// past MinIdle, the lowest pending id's idle time stands in (it is below
// MinIdle, which is all the gauge needs to say).
func (r *Reaper) gauges(ctx context.Context, st *streamState, oldest time.Duration) {
	if r.cfg.Metrics == nil {
		return
	}
	sum, err := r.cfg.Redis.XPending(ctx, st.Stream, st.Group).Result()
	if err != nil {
		return // NOGROUP or a failure already reported by the pass
	}
	if oldest == 0 && sum.Count > 0 {
		if pe, err := r.cfg.Redis.XPendingExt(ctx, &redis.XPendingExtArgs{
			Stream: st.Stream, Group: st.Group, Start: "-", End: "+", Count: 1,
		}).Result(); err == nil && len(pe) == 1 {
			oldest = pe[0].Idle
		}
	}
	r.cfg.Metrics.pel(st.Stream, sum.Count, oldest)
}

type entry struct {
	pe     redis.XPendingExt
	msg    redis.XMessage
	gone   bool
	ev     event.Event
	reject *event.RejectError
}

func (r *Reaper) base(st *streamState, pe redis.XPendingExt, kind Kind) Decision {
	return Decision{Time: r.cfg.Clock.Now(), Stream: st.Stream, Group: st.Group, ID: pe.ID,
		Consumer: pe.Consumer, Idle: pe.Idle, Deliveries: pe.RetryCount, Kind: kind, DryRun: r.cfg.DryRun}
}

func (r *Reaper) record(p *pass, d Decision) {
	p.add(d)
	r.decide(d)
}

// page decides one XPENDING page: bodies in one pipeline, ledger rows in one
// query, acks in one XACK, dead letters behind one fencing XCLAIM.
func (r *Reaper) page(ctx, workCtx context.Context, st *streamState, pend []redis.XPendingExt, p *pass, wg *sync.WaitGroup) error {
	rdb := r.cfg.Redis
	entries := make([]*entry, 0, len(pend))
	for _, pe := range pend {
		if r.isInFlight(st.Stream, pe.ID) {
			r.record(p, r.base(st, pe, KindInFlight))
			continue
		}
		entries = append(entries, &entry{pe: pe})
	}
	if len(entries) == 0 {
		return nil
	}

	pipe := rdb.Pipeline()
	cmds := make([]*redis.XMessageSliceCmd, len(entries))
	for i, e := range entries {
		cmds[i] = pipe.XRange(ctx, st.Stream, e.pe.ID, e.pe.ID)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("fetching %d bodies: %w", len(entries), err)
	}
	keys := make([]ledger.Key, 0, len(entries))
	for i, e := range entries {
		msgs := cmds[i].Val()
		if len(msgs) == 0 {
			e.gone = true
			continue
		}
		e.msg = msgs[0]
		ev, err := event.ParseFields(e.msg.Values, r.cfg.Rules)
		if err != nil {
			if !errors.As(err, &e.reject) {
				e.reject = &event.RejectError{Reason: event.ReasonNotJSON, Detail: err.Error()}
			}
			continue
		}
		e.ev = ev
		keys = append(keys, ledger.EventKey(ev))
	}
	recs, err := r.cfg.Ledger.Lookup(ctx, keys)
	if err != nil {
		return err
	}

	now := r.cfg.Clock.Now()
	var acks []Decision
	var dead []deadLetter
	var claims []*entry
	for _, e := range entries {
		d := r.base(st, e.pe, "")
		if e.reject == nil && !e.gone {
			d.Key = ledger.EventKey(e.ev).String()
		}
		rec, ok := recs[ledger.EventKey(e.ev)]
		switch {
		case e.gone:
			d.Kind = KindGone
			acks = append(acks, d)
		case e.reject != nil:
			d.Kind, d.Reason = KindInvalid, e.reject.Reason
			dead = append(dead, deadLetter{d: d, msg: e.msg, detail: e.reject.Error()})
		case ok && rec.Status.Terminal():
			if rec.StripeCustomerID != e.ev.StripeCustomerID || rec.AmountCents != e.ev.AmountCents || rec.Currency != e.ev.Currency {
				// A different charge for a billed customer and period: never
				// charge it, never drop it silently either (invariant 2).
				d.Kind, d.Reason = KindConflict, consumer.ReasonConflict
				dead = append(dead, deadLetter{d: d, msg: e.msg, detail: fmt.Sprintf(
					"the ledger has %s for %s with %d %s for %s; this event says %d %s for %s",
					rec.Status, rec.Key, rec.AmountCents, rec.Currency, rec.StripeCustomerID,
					e.ev.AmountCents, e.ev.Currency, e.ev.StripeCustomerID)})
				continue
			}
			// Already billed (partial batch, killed before XACK, AOF
			// rollback): ack, never redeliver (invariant 5).
			d.Kind, d.Reason = KindAlreadyBilled, string(rec.Status)
			acks = append(acks, d)
		case ok && rec.LeaseLive(now):
			// Reclaim while in flight: slow, not dead. Never claim it.
			d.Kind = KindLeaseLive
			d.Reason = fmt.Sprintf("lease held by %s until %s", rec.LeaseOwner, rec.LeaseExpiresAt.UTC().Format(time.RFC3339Nano))
			r.record(p, d)
		case e.pe.RetryCount >= r.cfg.MaxDeliveries:
			d.Kind, d.Reason = KindMaxDeliveries, consumer.ReasonMaxDelivery
			dead = append(dead, deadLetter{d: d, msg: e.msg, detail: fmt.Sprintf(
				"delivered %d times (max %d); last owner %s, idle %s", e.pe.RetryCount, r.cfg.MaxDeliveries, e.pe.Consumer, e.pe.Idle)})
		default:
			claims = append(claims, e)
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
	for _, dl := range dead {
		d := dl.d
		if !got[d.ID] {
			d.Kind, d.Reason = KindClaimLost, "dead letter fenced off: "+d.Reason
			r.record(p, d)
			continue
		}
		if err := consumer.DeadLetter(ctx, r.cfg.Redis, st.Stream, st.Group, r.cfg.Name, dl.msg, d.Reason, dl.detail, r.cfg.Clock.Now()); err != nil {
			d.Kind, d.Error = KindError, err.Error()
			r.record(p, d)
			continue
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
	d := r.base(st, e.pe, KindClaim)
	d.Key = ledger.EventKey(e.ev).String()
	if r.cfg.DryRun {
		r.record(p, d)
		return nil
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
		out, err := st.proc.Process(workCtx, st.Stream, msgs[0])
		rd := d
		rd.Time, rd.Kind, rd.Outcome = r.cfg.Clock.Now(), KindRedriven, out
		if err != nil {
			rd.Error = err.Error()
		}
		r.cfg.Metrics.redrive(out)
		r.record(p, rd)
	}()
	return nil
}

func (r *Reaper) isInFlight(stream, id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inFlight[stream+"\x00"+id]
}

func (r *Reaper) setInFlight(stream, id string, on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if on {
		r.inFlight[stream+"\x00"+id] = true
	} else {
		delete(r.inFlight, stream+"\x00"+id)
	}
}
