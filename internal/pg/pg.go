// Package pg opens the Postgres pool every pelguard binary shares, with
// errors that never carry the connection string's password.
package pg

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/internal/redact"
)

// Open parses url, opens a pool and pings it. maxConns <= 0 keeps pgx's default.
func Open(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parsing DATABASE_URL %s: %w", redact.URL(url), redact.Error(err))
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	return OpenConfig(ctx, cfg)
}

// OpenConfig opens a pool from a parsed config and pings it. The query
// mode is made pooler-safe (PoolerSafe) unless the URL names one.
func OpenConfig(ctx context.Context, cfg *pgxpool.Config) (*pgxpool.Pool, error) {
	PoolerSafe(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("opening Postgres: %w", redact.Error(err))
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connecting to Postgres at %s:%d (is it running? is DATABASE_URL right?): %w",
			cfg.ConnConfig.Host, cfg.ConnConfig.Port, redact.Error(PoolerHint(err)))
	}
	return pool, nil
}
