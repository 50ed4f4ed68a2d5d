package reaper

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
)

// The pass log: every pass is recorded, bounded, in Redis so the console
// shows the reaper's last passes (its metrics live in each process alone).
// One capped list per stream, newest first, holding the whole pass.

// PassLogLength bounds each stream's pass log.
const PassLogLength = 50

// PassesKey is the list that holds a stream's last passes.
func PassesKey(stream string) string { return stream + ":pelguard:reaper-passes" }

// PassRecord is one pass as the pass log keeps it.
type PassRecord struct {
	Reaper        string                   `json:"reaper"`
	Started       time.Time                `json:"started"`
	Duration      time.Duration            `json:"duration_ns"`
	Streams       []string                 `json:"streams"`
	Scanned       int                      `json:"scanned"`
	Decisions     map[Kind]int             `json:"decisions,omitempty"`
	Outcomes      map[consumer.Outcome]int `json:"outcomes,omitempty"`
	Error         string                   `json:"error,omitempty"`
	DryRun        bool                     `json:"dry_run,omitempty"`
	MinIdle       time.Duration            `json:"min_idle_ns"`
	MaxDeliveries int64                    `json:"max_deliveries"`
}

// logPass appends sum to every stream's pass log. A failure is logged: the
// log is for people, the pass's work is done.
func (r *Reaper) logPass(ctx context.Context, sum PassSummary, passErr error) {
	rec := PassRecord{Reaper: r.cfg.Name, Started: sum.Started, Duration: sum.Duration, Scanned: sum.Scanned,
		Decisions: sum.Decisions, Outcomes: sum.Outcomes, DryRun: r.cfg.DryRun,
		MinIdle: r.cfg.MinIdle, MaxDeliveries: r.cfg.MaxDeliveries}
	for _, st := range r.streams {
		rec.Streams = append(rec.Streams, st.Stream)
	}
	if passErr != nil {
		rec.Error = passErr.Error()
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return
	}
	pipe := r.cfg.Redis.Pipeline()
	for _, st := range r.streams {
		pipe.LPush(ctx, PassesKey(st.Stream), b)
		pipe.LTrim(ctx, PassesKey(st.Stream), 0, PassLogLength-1)
	}
	if _, err := pipe.Exec(ctx); err != nil && ctx.Err() == nil {
		r.cfg.Logger.WarnContext(ctx, "reaper: recording the pass in Redis failed", slog.Any("error", err))
	}
}

// RecentPasses reads a stream's pass log, newest first, at most n.
func RecentPasses(ctx context.Context, rdb redis.UniversalClient, stream string, n int) ([]PassRecord, error) {
	raw, err := rdb.LRange(ctx, PassesKey(stream), 0, int64(n)-1).Result()
	if err != nil {
		return nil, fmt.Errorf("reading the reaper's passes of %s: %w", stream, err)
	}
	out := make([]PassRecord, 0, len(raw))
	for _, s := range raw {
		var p PassRecord
		if json.Unmarshal([]byte(s), &p) == nil {
			out = append(out, p)
		}
	}
	return out, nil
}
