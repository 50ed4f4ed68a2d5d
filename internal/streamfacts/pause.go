package streamfacts

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pelguard/pelguard/internal/pg"
)

// Pause is a paused stream: who paused it, when and why.
type Pause struct {
	Stream, Group string
	At            time.Time
	By, Reason    string
}

// ErrNotPaused: Resume of a stream that is not paused.
var ErrNotPaused = errors.New("the stream is not paused")

// ErrAlreadyPaused: Pause of a stream that already is.
var ErrAlreadyPaused = errors.New("the stream is already paused")

// SetPaused pauses (paused) or resumes the stream's billing, recorded with
// who and why in stream_fact_changes.
func SetPaused(ctx context.Context, pool *pgxpool.Pool, schema, stream, group string, paused bool, by, reason string) error {
	db := pg.NewDB(pool, schema)
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pausing %s=%s: %w", stream, group, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	fact := "resume"
	var tag interface{ RowsAffected() int64 }
	if paused {
		fact = "pause"
		tag, err = tx.Exec(ctx, `INSERT INTO {schema}.stream_pauses (stream, consumer_group, paused_by, reason)
			VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`, stream, group, by, reason)
	} else {
		tag, err = tx.Exec(ctx, `DELETE FROM {schema}.stream_pauses WHERE stream = $1 AND consumer_group = $2`, stream, group)
	}
	switch {
	case err != nil:
		return fmt.Errorf("%s of %s=%s: %w", fact, stream, group, err)
	case tag.RowsAffected() == 0 && paused:
		return ErrAlreadyPaused
	case tag.RowsAffected() == 0:
		return ErrNotPaused
	}
	if _, err := tx.Exec(ctx, `INSERT INTO {schema}.stream_fact_changes (stream, consumer_group, fact, actor, reason)
		VALUES ($1, $2, $3, $4, $5)`, stream, group, fact, by, reason); err != nil {
		return fmt.Errorf("%s of %s=%s: %w", fact, stream, group, err)
	}
	return tx.Commit(ctx)
}

// Pauses lists the paused streams.
func Pauses(ctx context.Context, pool *pgxpool.Pool, schema string) ([]Pause, error) {
	rs, err := pg.NewDB(pool, schema).Query(ctx, `SELECT stream, consumer_group, paused_at, paused_by, reason
		FROM {schema}.stream_pauses ORDER BY paused_at, stream, consumer_group`)
	if err != nil {
		return nil, fmt.Errorf("reading paused streams: %w", err)
	}
	return pgx.CollectRows(rs, func(r pgx.CollectableRow) (Pause, error) {
		var p Pause
		err := r.Scan(&p.Stream, &p.Group, &p.At, &p.By, &p.Reason)
		return p, err
	})
}

// DefaultWatchEvery is how often a process reads the paused streams: a
// pause stops the fleet's Stripe calls within about this long (plus a call
// already in flight).
const DefaultWatchEvery = time.Second

// Watcher keeps a process's view of which streams are paused, read from
// the ledger every Every. Until its first read it reports nothing paused;
// Startup reads once before any consumer starts. A failed read keeps the
// last view (Postgres unreachable stops billing by itself: no ledger, no
// charge).
type Watcher struct {
	pool   *pgxpool.Pool
	schema string
	every  time.Duration
	logger *slog.Logger
	gauge  *prometheus.GaugeVec

	mu     sync.RWMutex
	paused map[[2]string]Pause
}

// NewWatcher builds a watcher; reg (optional) gets pelguard_stream_paused.
func NewWatcher(pool *pgxpool.Pool, schema string, every time.Duration, reg prometheus.Registerer, logger *slog.Logger) *Watcher {
	w := &Watcher{pool: pool, schema: schema, every: every, logger: logger, paused: map[[2]string]Pause{}}
	if w.every <= 0 {
		w.every = DefaultWatchEvery
	}
	if w.logger == nil {
		w.logger = slog.New(slog.DiscardHandler)
	}
	w.gauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pelguard_stream_paused",
		Help: "1 while an operator has paused billing from the stream (pelguard-consumer pause): nothing of it is sent to Stripe."},
		[]string{"stream", "group"})
	if reg != nil {
		reg.MustRegister(w.gauge)
	}
	return w
}

// Paused reports whether the stream's billing is paused.
func (w *Watcher) Paused(stream, group string) bool {
	if w == nil {
		return false
	}
	w.mu.RLock()
	defer w.mu.RUnlock()
	_, ok := w.paused[[2]string{stream, group}]
	return ok
}

// Func is Paused for one stream, whose pelguard_stream_paused series is
// exported from now on (0 while it is not paused), so a rule or dashboard
// sees every stream a role bills, not only the paused ones.
func (w *Watcher) Func(stream, group string) func() bool {
	if w == nil {
		return nil
	}
	w.gauge.WithLabelValues(stream, group)
	return func() bool { return w.Paused(stream, group) }
}

// Refresh reads the paused streams now.
func (w *Watcher) Refresh(ctx context.Context) error {
	ps, err := Pauses(ctx, w.pool, w.schema)
	if err != nil {
		return err
	}
	next := make(map[[2]string]Pause, len(ps))
	for _, p := range ps {
		next[[2]string{p.Stream, p.Group}] = p
	}
	w.mu.Lock()
	prev := w.paused
	w.paused = next
	w.mu.Unlock()
	for k, p := range next {
		if _, was := prev[k]; !was {
			w.logger.Warn("billing paused by an operator: nothing of this stream is sent to Stripe until it is resumed",
				"stream", p.Stream, "group", p.Group, "by", p.By, "reason", p.Reason, "since", p.At)
		}
		w.gauge.WithLabelValues(p.Stream, p.Group).Set(1)
	}
	for k := range prev {
		if _, still := next[k]; !still {
			w.logger.Info("billing resumed", "stream", k[0], "group", k[1])
			w.gauge.WithLabelValues(k[0], k[1]).Set(0)
		}
	}
	return nil
}

// Run refreshes every Every until ctx ends.
func (w *Watcher) Run(ctx context.Context) {
	t := time.NewTicker(w.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := w.Refresh(ctx); err != nil && ctx.Err() == nil {
			w.logger.Warn("reading paused streams failed; keeping the last view", "err", err)
		}
	}
}
