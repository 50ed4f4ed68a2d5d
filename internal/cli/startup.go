package cli

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/internal/redact"
	"github.com/pelguard/pelguard/internal/rollback"
	"github.com/pelguard/pelguard/internal/streamfacts"
)

// Startup is how the consumer, the reaper and the webhook receiver come up: /metrics, /healthz
// and /readyz first (so a waiting pod is alive but not ready), then the
// bounded wait for Redis and Postgres, then the checks that need them (the
// ledger schema, the host clock against Postgres').
type Startup struct {
	Prog        string
	MetricsAddr string
	Registry    *prometheus.Registry
	Redis       redis.UniversalClient
	Pool        *pgxpool.Pool
	Deps        []Dep
	Wait        time.Duration
	Schema      string
	// ClockLimit is the host clock skew refused at start, named by
	// ClockWhat in the error ("a third of --lease").
	ClockLimit time.Duration
	ClockWhat  string
	Logger     *slog.Logger
	// Agreement is checked once the schema is: a role whose namespace is
	// not its streams' does not start.
	Agreement Agreement
	// Pauses, when set, is read once before the service starts (a
	// consumer started while its stream is paused reads nothing), then
	// every second until ctx ends.
	Pauses *streamfacts.Watcher
	// Rollback, when set, starts watching the ledger for a rollback once
	// the schema is checked (NewRollback).
	Rollback *rollback.Monitor
}

// Run starts the ops server and waits for the dependencies. On success it
// returns the ops server (Close it) and the gate to Open once the service
// runs. Otherwise ok is false and code is the exit code: ExitOK when ctx
// ended while waiting (SIGTERM), else what Fail returns.
func (s Startup) Run(ctx context.Context, stderr io.Writer) (ops *Ops, started *Gate, code int, ok bool) {
	started = &Gate{}
	checks := []Check{started.Check(), {Name: "postgres", Fn: s.Pool.Ping}}
	if s.Redis != nil { // the webhook receiver has no Redis
		checks = append(checks, Check{Name: "redis", Fn: func(ctx context.Context) error { return s.Redis.Ping(ctx).Err() }})
	}
	ops, err := ServeOps(s.MetricsAddr, s.Registry, checks, s.Logger)
	if err != nil {
		return nil, nil, Fail(stderr, s.Prog, err), false
	}
	fail := func(err error) (*Ops, *Gate, int, bool) {
		_ = ops.Close(context.Background())
		return nil, nil, Fail(stderr, s.Prog, err), false
	}
	if err := (Waiter{For: s.Wait, Logger: s.Logger}).Wait(ctx, s.Deps...); err != nil {
		if ctx.Err() != nil {
			s.Logger.Info("stopped while waiting for Redis and Postgres")
			_ = ops.Close(context.Background())
			return nil, nil, ExitOK, false
		}
		return fail(err)
	}
	if err := CheckSchema(ctx, s.Prog, s.Pool, s.Schema); err != nil {
		return fail(err)
	}
	if err := s.Agreement.Check(ctx, s.Pool, s.Redis, s.Schema); err != nil {
		return fail(err)
	}
	if err := CheckClock(ctx, s.Pool, s.ClockLimit, s.ClockWhat); err != nil {
		return fail(err)
	}
	if s.Pauses != nil {
		if err := s.Pauses.Refresh(ctx); err != nil {
			return fail(redact.Error(err))
		}
		go s.Pauses.Run(ctx)
	}
	ReportDurability(ctx, s.Pool, s.Logger, s.Registry)
	if s.Rollback != nil {
		if err := s.Rollback.Start(ctx, s.Pool); err != nil {
			s.Logger.Warn("checking the ledger for a rollback at start", "err", err)
		}
	}
	return ops, started, ExitOK, true
}
