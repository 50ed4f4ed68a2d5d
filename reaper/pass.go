package reaper

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/stripeapi"
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

// reapStream pages through one stream's idle pending entries. Paging is
// sequential (each XPENDING starts after the last id of the one before), but
// up to PageWorkers pages are decided at once, so one page's ledger query
// overlaps the next page's Redis round trips. An entry is in one page only,
// so pages never race on the same entry.
func (r *Reaper) reapStream(ctx, workCtx context.Context, st *streamState, p *pass, wg *sync.WaitGroup) error {
	rdb := r.cfg.Redis
	start := "-"
	var oldest time.Duration
	pages := make(chan struct{}, r.cfg.PageWorkers)
	var pageWG sync.WaitGroup
	var errMu sync.Mutex
	var pageErr error
	failed := func() error {
		errMu.Lock()
		defer errMu.Unlock()
		return pageErr
	}
	err := func() error {
		for {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := failed(); err != nil {
				return nil // reported below
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
				return nil
			}
			for _, pe := range pend {
				oldest = max(oldest, pe.Idle)
			}
			p.mu.Lock()
			p.sum.Scanned += len(pend)
			p.mu.Unlock()
			select {
			case pages <- struct{}{}:
			case <-ctx.Done():
				return ctx.Err()
			}
			pageWG.Go(func() {
				defer func() { <-pages }()
				if err := r.page(ctx, workCtx, st, pend, p, wg); err != nil {
					errMu.Lock()
					pageErr = cmp.Or(pageErr, err)
					errMu.Unlock()
				}
			})
			if int64(len(pend)) < r.cfg.PageSize {
				return nil
			}
			// Exclusive start: entries acked meanwhile are gone from the PEL,
			// and skipped ones must not be read twice in one pass.
			start = "(" + pend[len(pend)-1].ID
		}
	}()
	pageWG.Wait()
	if err = cmp.Or(err, failed()); err != nil {
		return err
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
	quick  ledger.Key // from quickKey; zero when it could not read one
	billed bool       // payload is the canonical form of a terminal row's event
	ev     event.Event
	reject *event.RejectError
}

// quickKey reads customer_id and billing_period only: enough to look the
// ledger up. It validates nothing, and may even misread an odd payload: a
// wrong key only costs a full parse and a second look-up (see page). The
// common, canonical layout is read without a JSON decoder.
func quickKey(msg redis.XMessage) (ledger.Key, bool) {
	s, ok := msg.Values[event.PayloadField].(string)
	if !ok {
		return ledger.Key{}, false
	}
	cust, ok1 := stringAfter(s, `{"customer_id":"`, true)
	period, ok2 := stringAfter(s, `,"billing_period":"`, false)
	if ok1 && ok2 {
		return ledger.Key{CustomerID: cust, BillingPeriod: period}, true
	}
	var k struct {
		CustomerID    string `json:"customer_id"`
		BillingPeriod string `json:"billing_period"`
	}
	if err := json.Unmarshal([]byte(s), &k); err != nil || k.CustomerID == "" || k.BillingPeriod == "" {
		return ledger.Key{}, false
	}
	return ledger.Key{CustomerID: k.CustomerID, BillingPeriod: k.BillingPeriod}, true
}

// stringAfter returns the characters between marker and the next quote.
func stringAfter(s, marker string, prefix bool) (string, bool) {
	i := 0
	if prefix {
		if !strings.HasPrefix(s, marker) {
			return "", false
		}
	} else if i = strings.Index(s, marker); i < 0 {
		return "", false
	}
	rest := s[i+len(marker):]
	j := strings.IndexByte(rest, '"')
	if j <= 0 {
		return "", false
	}
	return rest[:j], true
}

// rowEvent is the event a ledger row was created from.
func rowEvent(rec ledger.Record) event.Event {
	return event.Event{CustomerID: rec.CustomerID, StripeCustomerID: rec.StripeCustomerID,
		AmountCents: rec.AmountCents, BillingPeriod: rec.BillingPeriod, Currency: rec.Currency}
}

// rowPayload is the canonical payload (event.Event.Payload) of a row's
// event. Rows hold validated identifiers, which JSON never escapes, so it is
// built by hand (json.Marshal was the pass's largest cost); anything with a
// character JSON might escape goes through Payload itself.
func rowPayload(rec ledger.Record) string {
	if !plain(rec.CustomerID) || !plain(rec.StripeCustomerID) || !plain(rec.BillingPeriod) || !plain(rec.Currency) {
		return rowEvent(rec).Payload()
	}
	var b strings.Builder
	b.Grow(110 + len(rec.CustomerID) + len(rec.StripeCustomerID) + len(rec.BillingPeriod))
	b.WriteString(`{"customer_id":"`)
	b.WriteString(rec.CustomerID)
	b.WriteString(`","stripe_customer_id":"`)
	b.WriteString(rec.StripeCustomerID)
	b.WriteString(`","amount_cents":`)
	b.WriteString(strconv.FormatInt(rec.AmountCents, 10))
	b.WriteString(`,"billing_period":"`)
	b.WriteString(rec.BillingPeriod)
	b.WriteString(`","currency":"`)
	b.WriteString(rec.Currency)
	b.WriteString(`"}`)
	return b.String()
}

// plain reports a string json.Marshal copies verbatim.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

func (r *Reaper) base(st *streamState, pe redis.XPendingExt, kind Kind) Decision {
	return Decision{Time: r.cfg.Clock.Now(), Stream: st.Stream, Group: st.Group, ID: pe.ID,
		Consumer: pe.Consumer, Idle: pe.Idle, Deliveries: pe.RetryCount, Kind: kind, DryRun: r.cfg.DryRun}
}

func (r *Reaper) record(p *pass, d Decision) {
	p.add(d)
	r.decide(d)
}

// page decides one XPENDING page: bodies in one range read, ledger rows in one
// query, acks in one XACK, dead letters behind one fencing XCLAIM.
func (r *Reaper) page(ctx, workCtx context.Context, st *streamState, pend []redis.XPendingExt, p *pass, wg *sync.WaitGroup) error {
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

	bodies, err := r.bodies(ctx, st, entries)
	if err != nil {
		return err
	}
	// Most of a large PEL is usually already billed. Full validation costs
	// more than everything else in a page, so the ledger is asked first, by
	// the key fields alone; an entry whose payload is byte for byte the
	// canonical form of a terminal row's event is that (valid) event, and
	// needs no further parsing. Everything else is fully validated.
	keys := make([]ledger.Key, 0, len(entries))
	for _, e := range entries {
		msg, ok := bodies[e.pe.ID]
		if !ok {
			e.gone = true
			continue
		}
		e.msg = msg
		if k, ok := quickKey(e.msg); ok {
			e.quick = k
			keys = append(keys, k)
		}
	}
	recs, err := r.ledger.Lookup(ctx, keys)
	if err != nil {
		return err
	}
	var more []ledger.Key
	for _, e := range entries {
		if e.gone {
			continue
		}
		if rec, ok := recs[e.quick]; ok && rec.Status.Terminal() && e.msg.Values[event.PayloadField] == rowPayload(rec) {
			e.ev, e.billed = rowEvent(rec), true
			continue
		}
		ev, err := event.ParseFields(e.msg.Values, r.cfg.Rules)
		if err != nil {
			if !errors.As(err, &e.reject) {
				e.reject = &event.RejectError{Reason: event.ReasonNotJSON, Detail: err.Error()}
			}
			continue
		}
		e.ev = ev
		if k := ledger.EventKey(ev); k != e.quick {
			more = append(more, k) // the quick reading got it wrong: never decide on the wrong row
		}
	}
	if len(more) > 0 {
		extra, err := r.ledger.Lookup(ctx, more)
		if err != nil {
			return err
		}
		maps.Copy(recs, extra)
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
		case e.billed:
			// Already billed (partial batch, killed before XACK, AOF
			// rollback): ack, never redeliver (invariant 5).
			d.Kind, d.Reason = KindAlreadyBilled, string(rec.Status)
			acks = append(acks, d)
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
			// Already billed, as above; the payload was valid but not in
			// canonical form.
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

// bodies fetches the page's entries. An abandoned batch is usually a run
// of consecutive stream entries, so one XRANGE over the page's id span
// (bounded to twice the page) usually returns them all; whatever that read
// did not cover is fetched with pipelined XRANGE id id. An entry inside the
// covered span that did not come back was deleted or trimmed.
func (r *Reaper) bodies(ctx context.Context, st *streamState, entries []*entry) (map[string]redis.XMessage, error) {
	out := make(map[string]redis.XMessage, len(entries))
	first, last := entries[0].pe.ID, entries[len(entries)-1].pe.ID
	limit := int64(2 * len(entries))
	span, err := r.cfg.Redis.XRangeN(ctx, st.Stream, first, last, limit).Result()
	if err != nil {
		return nil, fmt.Errorf("fetching bodies %s..%s: %w", first, last, err)
	}
	wanted := make(map[string]bool, len(entries))
	for _, e := range entries {
		wanted[e.pe.ID] = true
	}
	for _, m := range span {
		if wanted[m.ID] {
			out[m.ID] = m
		}
	}
	if int64(len(span)) < limit {
		return out, nil // the whole span was read
	}
	covered := span[len(span)-1].ID
	var rest []string
	for _, e := range entries {
		if _, ok := out[e.pe.ID]; !ok && compareIDs(e.pe.ID, covered) > 0 {
			rest = append(rest, e.pe.ID)
		}
	}
	pipe := r.cfg.Redis.Pipeline()
	cmds := make([]*redis.XMessageSliceCmd, len(rest))
	for i, id := range rest {
		cmds[i] = pipe.XRange(ctx, st.Stream, id, id)
	}
	if len(rest) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, fmt.Errorf("fetching %d bodies: %w", len(rest), err)
		}
	}
	for _, c := range cmds {
		if msgs := c.Val(); len(msgs) == 1 {
			out[msgs[0].ID] = msgs[0]
		}
	}
	return out, nil
}

// compareIDs orders stream ids ("ms-seq") numerically.
func compareIDs(a, b string) int {
	am, as, _ := strings.Cut(a, "-")
	bm, bs, _ := strings.Cut(b, "-")
	an, _ := strconv.ParseUint(am, 10, 64)
	bn, _ := strconv.ParseUint(bm, 10, 64)
	if c := cmp.Compare(an, bn); c != 0 {
		return c
	}
	asq, _ := strconv.ParseUint(as, 10, 64)
	bsq, _ := strconv.ParseUint(bs, 10, 64)
	return cmp.Compare(asq, bsq)
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
