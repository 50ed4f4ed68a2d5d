package console

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/redact"
	"github.com/pelguard/pelguard/reaper"
)

// The live pipeline (issue 30): what runs now, read from where each role
// records it — the liveness registry and the consumers' published stats,
// the reaper's pass log (Redis, capped), audit_runs, webhook_events, and
// Prometheus for the Stripe limiter, which lives in each process's metrics.

// maxConsumersShown bounds the consumers listed per stream (dead unique
// names stay in the group until the reaper's hygiene removes them).
const maxConsumersShown = 50

// consumerRow is one consumer of a stream's group, or a registered one
// that left it.
type consumerRow struct {
	Stream, Name string
	State        consumerState
	Member       bool   // in the group
	Held         int64  // pending entries it owns
	Idle         string // since it last read or claimed (XINFO)
	HasStats     bool
	PerSecond    float64
	Events       int64
	beatAge      time.Duration // 1<<63-1 when never registered
	memberIdle   time.Duration
}

// consumerPanel is the consumers of every stream, and how many were left
// out as gone longer than --consumer-idle.
type consumerPanel struct {
	Rows []consumerRow
	Gone int
}

// consumers lists each stream's consumers: group members (XINFO CONSUMERS)
// and registered ones, live first; those gone longer than --consumer-idle
// are counted, not listed.
func (s *Server) consumers(ctx context.Context) (consumerPanel, error) {
	var out consumerPanel
	now := s.now()
	for _, st := range s.cfg.Streams {
		rows := map[string]*consumerRow{}
		get := func(name string) *consumerRow {
			if r, ok := rows[name]; ok {
				return r
			}
			r := &consumerRow{Stream: st.Name, Name: name, beatAge: 1<<63 - 1}
			rows[name] = r
			return r
		}
		members, err := s.cfg.Redis.XInfoConsumers(ctx, st.Name, st.Group).Result()
		if err != nil && !redis.HasErrorPrefix(err, "NOGROUP") && !redis.HasErrorPrefix(err, "no such key") {
			return out, fmt.Errorf("XINFO CONSUMERS %s: %w", st.Name, err)
		}
		for _, m := range members {
			r := get(m.Name)
			r.Member, r.Held, r.Idle, r.memberIdle = true, m.Pending, ago(m.Idle), m.Idle
		}
		beats, err := consumer.Registered(ctx, s.cfg.Redis, st.Name, st.Group)
		if err != nil {
			return out, err
		}
		for name, at := range beats {
			get(name).beatAge = max(0, now.Sub(at))
		}
		list := make([]*consumerRow, 0, len(rows))
		for name, r := range rows {
			_, registered := beats[name]
			r.State = s.stateOf(st, name, registered, r.beatAge)
			if s.gone(r) {
				out.Gone++
				continue
			}
			list = append(list, r)
		}
		sort.Slice(list, func(i, j int) bool {
			if list[i].beatAge != list[j].beatAge {
				return list[i].beatAge < list[j].beatAge
			}
			return list[i].Name < list[j].Name
		})
		list = list[:min(len(list), maxConsumersShown)]
		names := make([]string, len(list))
		for i, r := range list {
			names[i] = r.Name
		}
		stats, err := consumer.ReadStats(ctx, s.cfg.Redis, st.Name, st.Group, names)
		if err != nil {
			return out, err
		}
		for _, r := range list {
			if x, ok := stats[r.Name]; ok {
				r.HasStats, r.PerSecond, r.Events = true, x.PerSecond, x.Events
			}
			out.Rows = append(out.Rows, *r)
		}
	}
	return out, nil
}

// passRow is one reaper pass as the overview shows it.
type passRow struct {
	reaper.PassRecord
	Ago       string
	Took      string
	Decisions string
	Error     string
}

// reaperPasses merges the streams' pass logs (a pass over several streams
// is in each), newest first.
func (s *Server) reaperPasses(ctx context.Context, n int) ([]passRow, error) {
	seen := map[string]bool{}
	var out []passRow
	for _, st := range s.cfg.Streams {
		ps, err := reaper.RecentPasses(ctx, s.cfg.Redis, st.Name, n)
		if err != nil {
			return nil, err
		}
		for _, p := range ps {
			k := p.Reaper + p.Started.String()
			if seen[k] {
				continue
			}
			seen[k] = true
			row := passRow{PassRecord: p, Ago: ago(max(0, s.now().Sub(p.Started))), Took: p.Duration.Round(time.Millisecond / 10).String(),
				Error: redact.String(truncate(p.Error, 300))}
			kinds := make([]string, 0, len(p.Decisions))
			for k := range p.Decisions {
				kinds = append(kinds, string(k))
			}
			slices.Sort(kinds)
			for i, k := range kinds {
				if i > 0 {
					row.Decisions += ", "
				}
				row.Decisions += fmt.Sprintf("%s %d", k, p.Decisions[reaper.Kind(k)])
			}
			out = append(out, row)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Started.After(out[j].Started) })
	return out[:min(len(out), n)], nil
}

// auditRun is one of the auditor's last runs.
type auditRun struct {
	ID       int64
	Started  time.Time
	Took     string
	Status   string
	Scanned  int64
	New      int
	Resolved int
	Error    string
	Manual   bool
}

const qAuditRuns = `SELECT id, started_at, finished_at, status, charges_scanned, findings_new, findings_resolved,
		coalesce(error, ''), manual
	FROM {schema}.audit_runs ORDER BY id DESC LIMIT $1`

func auditRuns(ctx context.Context, db pg.DB, n int) ([]auditRun, error) {
	rows, err := db.Query(ctx, qAuditRuns, n)
	if err != nil {
		return nil, fmt.Errorf("reading the last audit runs: %w", err)
	}
	defer rows.Close()
	var out []auditRun
	for rows.Next() {
		var r auditRun
		var fin *time.Time
		if err := rows.Scan(&r.ID, &r.Started, &fin, &r.Status, &r.Scanned, &r.New, &r.Resolved, &r.Error, &r.Manual); err != nil {
			return nil, err
		}
		if fin != nil {
			r.Took = fin.Sub(r.Started).Round(time.Millisecond).String()
		}
		r.Error = redact.String(truncate(r.Error, 300))
		out = append(out, r)
	}
	return out, rows.Err()
}

// webhookFreshness is when Stripe's last webhook event was applied.
type webhookFreshness struct {
	Any      bool
	Last     time.Time
	Ago      string
	Type     string
	Result   string
	LastHour int64
}

const (
	qLastWebhook   = `SELECT received_at, type, result FROM {schema}.webhook_events ORDER BY received_at DESC LIMIT 1`
	qWebhooksSince = `SELECT count(*) FROM {schema}.webhook_events WHERE received_at > $1`
)

func (s *Server) webhooks(ctx context.Context) (webhookFreshness, error) {
	var w webhookFreshness
	err := s.db.QueryRow(ctx, qLastWebhook).Scan(&w.Last, &w.Type, &w.Result)
	if errors.Is(err, pgx.ErrNoRows) {
		return w, nil
	}
	if err != nil {
		return w, fmt.Errorf("reading the last webhook event: %w", err)
	}
	w.Any, w.Ago = true, ago(max(0, s.now().Sub(w.Last)))
	if err := s.db.QueryRow(ctx, qWebhooksSince, s.now().Add(-time.Hour)).Scan(&w.LastHour); err != nil {
		return w, fmt.Errorf("counting webhook events: %w", err)
	}
	return w, nil
}

// liveData is the live pipeline, gathered at once (the parts read
// different stores, and the overview's own queries run beside them).
type liveData struct {
	Consumers    consumerPanel
	Passes       []passRow
	AuditRuns    []auditRun
	Webhooks     webhookFreshness
	Limiter      []limiterRow
	LimiterError string
	Charts       []chart
	LimiterChart *chart
}

// live gathers the live pipeline for the overview; periods are the latest
// billing periods, newest first.
func (s *Server) live(ctx context.Context, periods []string) (liveData, error) {
	var d liveData
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) { d.Consumers, err = s.consumers(ctx); return })
	g.Go(func() (err error) { d.Passes, err = s.reaperPasses(ctx, 8); return })
	g.Go(func() (err error) { d.AuditRuns, err = auditRuns(ctx, s.db, 5); return })
	g.Go(func() (err error) { d.Webhooks, err = s.webhooks(ctx); return })
	g.Go(func() (err error) { d.Charts, err = s.charts(ctx, periods); return })
	if s.cfg.PrometheusURL != "" {
		g.Go(func() error {
			lim, err := s.limiter(ctx)
			start := s.now().Truncate(time.Hour).Add(-(chartHours - 1) * time.Hour)
			c, herr := s.limiterChart(ctx, start)
			d.Limiter, d.LimiterChart = lim, &c
			if err = errors.Join(err, herr); err != nil {
				d.LimiterError = redact.String(err.Error()) // shown; the page still renders
			}
			return nil
		})
	}
	return d, g.Wait()
}
