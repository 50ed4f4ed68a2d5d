package reaper

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
)

// Bounding the streams (docs/operations/bounded.md). Every pass, for each
// stream it tends, the reaper
//
//  1. detects entries someone else removed before a group read them
//     (detectLoss, before the stream is reaped), and alerts;
//  2. trims the stream to the oldest entry any group still needs, never
//     past StreamRetention (trim.lua);
//  3. alerts on a dead-letter stream past DeadLetterMax or DeadLetterMaxAge
//     (checkDeadLetters). Dead letters are never trimmed.
//
// And the pending entries it acks as gone are alerted at the end of the
// pass (reportGone).

//go:embed trim.lua
var trimLua string

var trimScript = redis.NewScript(trimLua)

// lossRecordTTL: a stream's loss records expire this long after the last
// one was written, so the console shows a loss for a month.
const lossRecordTTL = 30 * 24 * time.Hour

// deadLetterRepeat: while a dead-letter stream stays past its thresholds,
// it is alerted again after this long (a reminder, not a page per pass).
const deadLetterRepeat = 24 * time.Hour

// LossesKey is the hash that records the losses seen on a stream, one
// field per group and kind (LossRecord as JSON), for the console. It
// carries the stream's hash tag, so it lives on the stream's slot.
func LossesKey(stream string) string { return stream + ":pelguard:losses" }

// LossRecord is one loss as LossesKey keeps it.
type LossRecord struct {
	alerts.StreamLoss
	Seen time.Time `json:"seen"`
}

// Losses reads the losses recorded for stream, any order.
func Losses(ctx context.Context, rdb redis.UniversalClient, stream string) ([]LossRecord, error) {
	raw, err := rdb.HGetAll(ctx, LossesKey(stream)).Result()
	if err != nil {
		return nil, fmt.Errorf("reading the losses of %s: %w", stream, err)
	}
	out := make([]LossRecord, 0, len(raw))
	for _, s := range raw {
		var l LossRecord
		if json.Unmarshal([]byte(s), &l) == nil {
			out = append(out, l)
		}
	}
	return out, nil
}

// bound is the streams' share of hygiene: trim, dead letters. The pass
// detects losses (detectLoss) before it reaps, so the alert counts the
// pending entries trimmed with them before the reaper acks them as gone.
func (r *Reaper) bound(ctx context.Context, st *streamState) error {
	var errs []error
	if err := r.trim(ctx, st); err != nil {
		errs = append(errs, fmt.Errorf("trimming: %w", err))
	}
	if err := r.checkDeadLetters(ctx, st); err != nil {
		errs = append(errs, fmt.Errorf("dead letters: %w", err))
	}
	return errors.Join(errs...)
}

// trim runs trim.lua on st's stream. A dry run trims nothing.
func (r *Reaper) trim(ctx context.Context, st *streamState) error {
	if r.cfg.StreamRetention < 0 || r.cfg.DryRun {
		return nil
	}
	retention := strconv.FormatInt(r.cfg.Clock.Now().Add(-r.cfg.StreamRetention).UnixMilli(), 10) + "-0"
	res, err := trimScript.Run(ctx, r.cfg.Redis, []string{st.Stream}, st.Group, retention, r.cfg.TrimLimit).Slice()
	if err != nil {
		return fmt.Errorf("trim.lua: %w", err)
	}
	if len(res) != 4 {
		return fmt.Errorf("trim.lua: unexpected reply %v", res)
	}
	removed, _ := res[0].(int64)
	minID, _ := res[1].(string)
	length, _ := res[2].(int64)
	r.cfg.Metrics.trimmed(st.Stream, removed, length)
	if removed > 0 {
		r.cfg.Logger.InfoContext(ctx, "reaper: trimmed the stream below what its groups need",
			"stream", st.Stream, "removed", removed, "minid", minID, "length", length)
	}
	return nil
}

// detectLoss compares each group on st's stream with the stream's first
// entry. Trimming moves recorded-first-entry-id and not
// max-deleted-entry-id; a group whose last-delivered-id is below the first
// entry has entries it never read gone. While its entries-read is valid,
// (entries-added − length) − entries-read counts them; when lag is null,
// the count is unknown.
//
// A group that has read nothing has no valid entries-read, and Redis
// cannot tell a group that lost entries from one created at 0 (or moved
// back) after they were trimmed: the recreated group after a failover,
// another team's new group. Such a group's loss is alerted only when an
// earlier pass saw it with no gap (intact): what was removed since then
// was added while it existed, unread.
//
// The loss is visible while the group has not read past it: the next
// XREADGROUP jumps over the gap. A group whose consumers run reads past a
// producer's trim within milliseconds; the alert then comes from the
// pending entries trimmed with it (acked as gone), if any. The reaper's
// own trim never triggers it: it stays at or below every last-delivered-id.
func (r *Reaper) detectLoss(ctx context.Context, st *streamState) error {
	r.cfg.Metrics.watching(st.Stream, st.Group)
	info, err := r.cfg.Redis.XInfoStream(ctx, st.Stream).Result()
	if redis.HasErrorPrefix(err, "no such key") || errors.Is(err, redis.Nil) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("XINFO STREAM: %w", err)
	}
	groups, err := r.cfg.Redis.XInfoGroups(ctx, st.Stream).Result()
	if err != nil {
		return fmt.Errorf("XINFO GROUPS: %w", err)
	}
	removed := info.EntriesAdded - info.Length
	if st.intact == nil {
		st.intact = map[string]int64{}
	}
	present := make(map[string]bool, len(groups))
	for _, g := range groups {
		present[g.Name] = true
		var l alerts.StreamLoss
		switch {
		case removed > 0 && info.Length > 0 && idLess(g.LastDeliveredID, prevID(info.RecordedFirstEntryID)):
			l = alerts.StreamLoss{After: g.LastDeliveredID, Before: info.RecordedFirstEntryID}
		case info.Length == 0 && removed > 0 && idLess(g.LastDeliveredID, info.LastGeneratedID):
			// An empty stream lost all it held.
			l = alerts.StreamLoss{After: g.LastDeliveredID, Before: nextID(info.LastGeneratedID)}
		default:
			if g.EntriesRead == 0 { // nothing read (go-redis reads a null entries-read as 0)
				st.intact[g.Name] = removed
			} else {
				delete(st.intact, g.Name)
			}
			continue
		}
		l.Stream, l.Group, l.Count = st.Stream, g.Name, -1
		if g.EntriesRead == 0 {
			before, ok := st.intact[g.Name]
			if !ok {
				continue // never seen whole: created at 0 or moved back after the trim, or lost before this process watched
			}
			l.Count = removed - before
		} else if g.Lag >= 0 {
			l.Count = removed - g.EntriesRead
		}
		if l.Count == 0 || l.Count < -1 {
			continue // the gap held nothing (ids are not dense)
		}
		if pend, err := r.cfg.Redis.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: st.Stream, Group: g.Name,
			Start: "-", End: "(" + l.Before, Count: r.cfg.PageSize}).Result(); err == nil {
			l.Pending = int64(len(pend))
		}
		r.reportLoss(ctx, st, l)
	}
	for name := range st.intact {
		if !present[name] {
			delete(st.intact, name)
		}
	}
	return nil
}

// reportLoss alerts l once (per group, while its range stays the same),
// counts it and records it for the console.
func (r *Reaper) reportLoss(ctx context.Context, st *streamState, l alerts.StreamLoss) {
	key := fmt.Sprintf("%t\x00%s", l.Gone, l.Group)
	seen := l.After + "\x00" + l.Before
	if st.lossSeen == nil {
		st.lossSeen = map[string]string{}
	}
	if st.lossSeen[key] == seen {
		return
	}
	st.lossSeen[key] = seen
	r.cfg.Metrics.lost(l)
	r.cfg.Logger.WarnContext(ctx, "reaper: entries left the stream unbilled",
		"stream", l.Stream, "group", l.Group, "count", l.CountText(), "after", l.After, "before", l.Before,
		"pending", l.Pending, "gone_acks", l.Gone)
	if r.cfg.DryRun {
		return
	}
	r.cfg.Notifier.Notify(alerts.StreamEntriesLost(l))
	b, err := json.Marshal(LossRecord{StreamLoss: l, Seen: r.cfg.Clock.Now()})
	if err != nil {
		return
	}
	field := l.Group
	if l.Gone {
		field = "gone:" + l.Group
	}
	pipe := r.cfg.Redis.TxPipeline()
	pipe.HSet(ctx, LossesKey(st.Stream), field, b)
	pipe.Expire(ctx, LossesKey(st.Stream), lossRecordTTL)
	if _, err := pipe.Exec(ctx); err != nil && ctx.Err() == nil {
		r.cfg.Logger.WarnContext(ctx, "reaper: recording a loss in Redis failed", slog.Any("error", err))
	}
}

// goneSpan accumulates one pass's gone acks of a stream.
type goneSpan struct {
	n      int64
	lo, hi string
}

// noteGone records ids acked as gone (the XACK succeeded).
func (st *streamState) noteGone(ids []string) {
	st.goneMu.Lock()
	defer st.goneMu.Unlock()
	for _, id := range ids {
		if st.gone.n == 0 || idLess(id, st.gone.lo) {
			st.gone.lo = id
		}
		if st.gone.n == 0 || idLess(st.gone.hi, id) {
			st.gone.hi = id
		}
		st.gone.n++
	}
}

// reportGone alerts the pass's gone acks of st, one alert, and resets them.
func (r *Reaper) reportGone(ctx context.Context, st *streamState) {
	st.goneMu.Lock()
	g := st.gone
	st.gone = goneSpan{}
	st.goneMu.Unlock()
	if g.n == 0 {
		return
	}
	r.reportLoss(ctx, st, alerts.StreamLoss{Stream: st.Stream, Group: st.Group, Count: g.n, After: g.lo, Before: g.hi, Gone: true})
}

// checkDeadLetters sets the dead-letter gauges and alerts when st's
// dead-letter stream is past a threshold: at once, then every
// deadLetterRepeat while it stays past.
func (r *Reaper) checkDeadLetters(ctx context.Context, st *streamState) error {
	dead := consumer.DeadLetterStream(st.Stream)
	n, err := r.cfg.Redis.XLen(ctx, dead).Result()
	if err != nil {
		return fmt.Errorf("XLEN %s: %w", dead, err)
	}
	var age time.Duration
	if n > 0 {
		msgs, err := r.cfg.Redis.XRangeN(ctx, dead, "-", "+", 1).Result()
		if err != nil {
			return fmt.Errorf("XRANGE %s: %w", dead, err)
		}
		if len(msgs) == 1 {
			if ms, ok := idMillis(msgs[0].ID); ok {
				age = max(0, r.cfg.Clock.Now().Sub(time.UnixMilli(ms)))
			}
		}
	}
	r.cfg.Metrics.deadLetters(st.Stream, n, age)
	over := (r.cfg.DeadLetterMax > 0 && n >= r.cfg.DeadLetterMax) ||
		(r.cfg.DeadLetterMaxAge > 0 && n > 0 && age >= r.cfg.DeadLetterMaxAge)
	now := r.cfg.Clock.Now()
	switch {
	case !over:
		st.deadAlerted = time.Time{} // below again: the next crossing alerts at once
	case r.cfg.DryRun:
	case st.deadAlerted.IsZero() || now.Sub(st.deadAlerted) >= deadLetterRepeat:
		st.deadAlerted = now
		r.cfg.Notifier.Notify(alerts.DeadLettersWaiting(st.Stream, dead, n, age, r.cfg.DeadLetterMax, r.cfg.DeadLetterMaxAge))
	}
	return nil
}

// idMillis is the millisecond part of a stream id.
func idMillis(id string) (int64, bool) {
	ms, _, _ := strings.Cut(id, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	return n, err == nil
}

// parseID splits "ms-seq"; a bad id is 0-0.
func parseID(id string) (ms, seq uint64) {
	a, b, _ := strings.Cut(id, "-")
	ms, _ = strconv.ParseUint(a, 10, 64)
	seq, _ = strconv.ParseUint(b, 10, 64)
	return ms, seq
}

// idLess reports a < b as stream ids.
func idLess(a, b string) bool {
	am, as := parseID(a)
	bm, bs := parseID(b)
	return am < bm || (am == bm && as < bs)
}

// prevID is the id just below id (0-0 stays 0-0).
func prevID(id string) string {
	ms, seq := parseID(id)
	switch {
	case seq > 0:
		seq--
	case ms > 0:
		ms, seq = ms-1, ^uint64(0)
	}
	return strconv.FormatUint(ms, 10) + "-" + strconv.FormatUint(seq, 10)
}

// nextID is the id just above id.
func nextID(id string) string {
	ms, seq := parseID(id)
	if seq == ^uint64(0) {
		ms, seq = ms+1, 0
	} else {
		seq++
	}
	return strconv.FormatUint(ms, 10) + "-" + strconv.FormatUint(seq, 10)
}
