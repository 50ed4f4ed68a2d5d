package reaper

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/cmdname"
)

// Liveness (invariant 5 for consumers without a heartbeat): a group member
// that never registered as a pelguard consumer (consumer.LivenessKey) may be
// a team's consumer in the middle of a slow Stripe call; its entries are
// left alone until an operator says it is stopped.

// loadImported reads, once a pass, the periods with imported history. On
// a failure none counts as imported: unregistered owners' entries are then
// left alone, the safe side.
func (r *Reaper) loadImported(ctx context.Context) error {
	imported, err := r.ledger.ImportedPeriods(ctx)
	if err != nil {
		imported = map[string]bool{}
	}
	r.mu.Lock()
	r.imported = imported
	r.mu.Unlock()
	return err
}

// loadLiveness reads, for this pass, the group's registered consumers.
func (r *Reaper) loadLiveness(ctx context.Context, st *streamState) error {
	reg, err := consumer.Registered(ctx, r.cfg.Redis, st.Stream, st.Group)
	if err != nil {
		return err
	}
	st.registered = make(map[string]bool, len(reg))
	for name := range reg {
		st.registered[name] = true
	}
	st.unregMu.Lock()
	st.unregistered = map[string]int{}
	st.unregMu.Unlock()
	return nil
}

// ownerUnknown reports whether owner's entries must be left alone unless
// their period was imported.
func (r *Reaper) ownerUnknown(st *streamState, owner string) bool {
	return owner != r.cfg.Name && !st.registered[owner] && !r.stopped[owner]
}

// noteUnregistered counts an unregistered_consumer decision.
func (st *streamState) noteUnregistered(owner string) {
	st.unregMu.Lock()
	st.unregistered[owner]++
	st.unregMu.Unlock()
}

// reportUnregistered warns once per pass, and alerts once per process for
// each consumer not named before.
func (r *Reaper) reportUnregistered(ctx context.Context, st *streamState) {
	st.unregMu.Lock()
	counts := maps.Clone(st.unregistered)
	st.unregMu.Unlock()
	if len(counts) == 0 {
		return
	}
	names := slices.Sorted(maps.Keys(counts))
	total := 0
	for _, n := range counts {
		total += n
	}
	r.cfg.Logger.WarnContext(ctx, "reaper: entries of consumers that never registered as pelguard consumers are left alone",
		slog.String("stream", st.Stream), slog.String("group", st.Group), slog.Int("entries", total),
		slog.String("consumers", strings.Join(names, ",")),
		slog.String("fix", "once they are stopped: --stopped-consumers "+strings.Join(names, ",")+", or `"+cmdname.Consumer+" import` for their periods"))
	if r.cfg.DryRun {
		return
	}
	r.mu.Lock()
	var fresh []string
	for _, n := range names {
		if !r.alerted[n] {
			r.alerted[n] = true
			fresh = append(fresh, n)
		}
	}
	r.mu.Unlock()
	if len(fresh) > 0 {
		r.cfg.Notifier.Notify(alerts.UnregisteredConsumers(st.Stream, st.Group, fresh, total))
	}
}

// stoppedSet is Config.StoppedConsumers as a set.
func stoppedSet(names []string) map[string]bool {
	m := map[string]bool{}
	for _, n := range names {
		if n = strings.TrimSpace(n); n != "" {
			m[n] = true
		}
	}
	return m
}
