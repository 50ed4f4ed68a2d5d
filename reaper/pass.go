package reaper

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
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
	if err := r.loadImported(ctx); err != nil {
		errs = append(errs, fmt.Errorf("reading the periods with imported history: %w", err))
	}
	for _, st := range r.streams {
		if err := r.detectLoss(ctx, st); err != nil {
			errs = append(errs, fmt.Errorf("detecting lost entries of %s: %w", st, err))
		}
		if r.paused(st.StreamGroup) {
			r.cfg.Logger.DebugContext(ctx, "reaper: billing paused; stream left alone", "stream", st.Stream, "group", st.Group)
			continue
		}
		if err := r.reapStream(ctx, workCtx, st, p, wg); err != nil {
			errs = append(errs, fmt.Errorf("reaping %s: %w", st, err))
		}
		r.reportGone(ctx, st)
		if err := r.hygiene(ctx, st, p); err != nil {
			errs = append(errs, fmt.Errorf("hygiene on %s: %w", st, err))
		}
	}
	for _, ms := range r.meters {
		if err := r.detectLoss(ctx, ms.streamState); err != nil {
			errs = append(errs, fmt.Errorf("detecting lost entries of %s: %w", ms, err))
		}
		if r.paused(ms.StreamGroup) {
			r.cfg.Logger.DebugContext(ctx, "reaper: billing paused; meter stream left alone", "stream", ms.Stream, "group", ms.Group)
			continue
		}
		if err := r.reapMeterStream(ctx, workCtx, ms, p, wg); err != nil {
			errs = append(errs, fmt.Errorf("reaping meter stream %s: %w", ms, err))
		}
		r.reportGone(ctx, ms.streamState)
		if err := r.hygiene(ctx, ms.streamState, p); err != nil {
			errs = append(errs, fmt.Errorf("hygiene on %s: %w", ms, err))
		}
	}
	elapsed := time.Since(start)
	r.cfg.Metrics.passDone(elapsed)
	if wg != nil {
		wg.Wait()
	}
	sum := p.summary()
	sum.Duration = elapsed
	attrs := []any{slog.Int("streams", len(r.streams)+len(r.meters)), slog.Int("scanned", sum.Scanned),
		slog.Duration("duration", elapsed), slog.Bool("dry_run", r.cfg.DryRun)}
	for k, n := range sum.Decisions {
		attrs = append(attrs, slog.Int(string(k), n))
	}
	err := errors.Join(errs...)
	if err != nil {
		attrs = append(attrs, slog.Any("error", err))
	}
	r.cfg.Logger.InfoContext(ctx, "reaper pass", attrs...)
	r.logPass(ctx, sum, err)
	return sum, err
}

// reapStream pages through one stream's idle pending entries. Paging is
// sequential (each XPENDING starts after the last id of the one before), but
// up to PageWorkers pages are decided at once, so one page's ledger query
// overlaps the next page's Redis round trips. An entry is in one page only,
// so pages never race on the same entry.
func (r *Reaper) reapStream(ctx, workCtx context.Context, st *streamState, p *pass, wg *sync.WaitGroup) error {
	rdb := r.cfg.Redis
	if err := r.loadLiveness(ctx, st); err != nil {
		return err
	}
	defer r.reportUnregistered(ctx, st)
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

// page handles one XPENDING page in three steps: fetch (bodies in one range
// read, ledger rows in one query), decide (decideEntry, pure, per entry) and
// act (acks in one XACK, dead letters behind one fencing XCLAIM, claims).
func (r *Reaper) page(ctx, workCtx context.Context, st *streamState, pend []redis.XPendingExt, p *pass, wg *sync.WaitGroup) error {
	cfg := r.decideConfig()
	items := make([]entry, len(pend)) // one allocation for the page
	entries := make([]*entry, 0, len(pend))
	for i, pe := range pend {
		if r.isInFlight(st.Stream, pe.ID) {
			// Nothing to fetch: decided and counted now, even if the page's
			// I/O fails.
			r.record(p, r.decision(st, pe, decideEntry(cfg, decideInput{Pending: pe, InFlight: true})))
			continue
		}
		items[i].pe = pe
		// Liveness does not apply to a team's table: its consumers never
		// register; MinIdle ≥ 2 × ExternalMaxCall guards them instead.
		items[i].ownerUnknown = r.team == nil && r.ownerUnknown(st, pe.Consumer)
		entries = append(entries, &items[i])
	}
	if len(entries) == 0 {
		return nil
	}
	rows, err := r.fetch(ctx, st, entries)
	if err != nil {
		return err
	}
	now := r.cfg.Clock.Now()
	var again []*entry
	for _, e := range entries {
		if e.v = decideEntry(cfg, e.input(rows, now)); e.v.NeedRow {
			again = append(again, e)
		}
	}
	if len(again) > 0 {
		if err := r.refetchRows(ctx, again, rows); err != nil {
			return err
		}
		for _, e := range again {
			e.v = decideEntry(cfg, e.input(rows, now))
		}
	}
	return r.act(ctx, workCtx, st, entries, p, wg)
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
