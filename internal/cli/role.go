package cli

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/internal/rollback"
	"github.com/pelguard/pelguard/internal/streamfacts"
	"github.com/pelguard/pelguard/stripeapi"
	"github.com/pelguard/pelguard/stripelimit"
)

// Role is what a long-running role (consumer, meter consumer, reaper) is
// built from: its flags' values. BuildRole makes its parts the same way
// for every role, so the checks a role owes the fleet (the streams'
// namespace, the pause) are made in one place.
type Role struct {
	// Metrics names the registry (pelguard_build_info{role}); Witness the
	// ledger witness's row (role/name); Trace, when set, names the traced
	// service.
	Metrics, Witness, Trace string
	Name, Schema            string
	RedisURL, DBURL         string
	Log                     Logging
	Slack                   Slack
	// Stripe, when set, builds the role's Stripe client, paced as Share.
	Stripe *Stripe
	Share  stripelimit.Role
	// Conns is the pool size (MaxDBConns).
	Conns int32
}

// RoleParts are a built role's collaborators; Close releases them.
type RoleParts struct {
	Logger   *slog.Logger
	Registry *prometheus.Registry
	Notifier alerts.Notifier
	Redis    redis.UniversalClient
	Stripe   *stripeapi.Client // nil without Role.Stripe
	Witness  *rollback.Monitor
	Pool     *pgxpool.Pool
	Pauses   *streamfacts.Watcher
	Deps     []Dep
	closers  []func()
}

// BuildRole builds the role's logger, registry, notifier, Redis client,
// Stripe client, ledger witness, pool and pause watcher without
// connecting: a configuration error is a UsageError here.
func BuildRole(ctx context.Context, stderr io.Writer, r Role) (*RoleParts, error) {
	p := &RoleParts{}
	fail := func(err error) (*RoleParts, error) { p.Close(); return nil, err }
	var err error
	if p.Logger, err = r.Log.Logger(stderr); err != nil {
		return nil, err
	}
	RouteLibraryLogs(p.Logger)
	if r.Trace != "" {
		stop, err := Tracing(ctx, r.Trace)
		if err != nil {
			return nil, err
		}
		p.closers = append(p.closers, stop)
	}
	p.Registry = NewRegistry(r.Metrics)
	if p.Notifier, err = r.Slack.Notifier(p.Logger, p.Registry); err != nil {
		return fail(err)
	}
	p.closers = append(p.closers, func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Notifier.Close(cctx)
	})
	rdb, redisDep, err := NewRedis(r.RedisURL)
	if err != nil {
		return fail(err)
	}
	p.Redis = rdb
	p.closers = append(p.closers, func() { _ = rdb.Close() })
	if r.Stripe != nil {
		if p.Stripe, err = r.Stripe.Client(p.Logger, nil, Share{Role: r.Share, Redis: rdb, Registerer: p.Registry}); err != nil {
			return fail(err)
		}
	}
	if p.Witness, err = NewRollback(r.Witness, r.Name, r.Schema, rdb, p.Notifier, p.Logger, p.Registry); err != nil {
		return fail(err)
	}
	pool, pgDep, err := NewDB(r.DBURL, r.Conns, p.Witness.AfterConnect)
	if err != nil {
		return fail(err)
	}
	p.Pool = pool
	mon := p.Witness
	p.closers = append(p.closers, pool.Close, mon.Close) // the witness closes before the pool
	p.Deps = []Dep{redisDep, pgDep}
	p.Pauses = streamfacts.NewWatcher(pool, r.Schema, 0, p.Registry, p.Logger)
	return p, nil
}

// Close releases what BuildRole made, in reverse order.
func (p *RoleParts) Close() {
	for i := len(p.closers) - 1; i >= 0; i-- {
		p.closers[i]()
	}
	p.closers = nil
}
