// Package migrations holds pelguard's Postgres schema as numbered, embedded
// SQL files and applies them with goose. Every binary exposes them as
// `migrate up|down|status`.
//
// Two `migrate up` at once are safe: goose holds a Postgres session advisory
// lock for the whole run, so the second waits and then finds nothing to do.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// VersionTable is where goose records which migrations have been applied.
const VersionTable = "pelguard_schema_migrations"

// Status is one migration's state.
type Status struct {
	Version int64
	Name    string
	Applied bool
}

// Migrator applies pelguard's migrations to one database (or, in tests, one
// schema selected by the pool's search_path).
type Migrator struct {
	db       *sql.DB
	provider *goose.Provider
}

// New builds a Migrator over pool. Close releases the database/sql handle
// (the pool itself stays open).
func New(pool *pgxpool.Pool, logger *slog.Logger) (*Migrator, error) {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, fmt.Errorf("creating migration lock: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	opts := []goose.ProviderOption{
		goose.WithSessionLocker(locker),
		goose.WithTableName(VersionTable),
		goose.WithDisableGlobalRegistry(true),
	}
	if logger != nil {
		opts = append(opts, goose.WithSlog(logger))
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, files, opts...)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("loading migrations: %w", err)
	}
	return &Migrator{db: db, provider: p}, nil
}

// Close releases the migrator's database handle.
func (m *Migrator) Close() error { return m.db.Close() }

// Up applies every pending migration and returns the versions applied.
func (m *Migrator) Up(ctx context.Context) ([]int64, error) {
	res, err := m.provider.Up(ctx)
	if err != nil {
		return versions(res), fmt.Errorf("migrating up: %w", err)
	}
	return versions(res), nil
}

// Down rolls back every applied migration, newest first, and returns the
// versions rolled back. It destroys the ledger: callers must confirm first.
func (m *Migrator) Down(ctx context.Context) ([]int64, error) {
	res, err := m.provider.DownTo(ctx, 0)
	if err != nil {
		return versions(res), fmt.Errorf("migrating down: %w", err)
	}
	return versions(res), nil
}

// Status lists every known migration and whether it is applied.
func (m *Migrator) Status(ctx context.Context) ([]Status, error) {
	st, err := m.provider.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading migration status: %w", err)
	}
	out := make([]Status, 0, len(st))
	for _, s := range st {
		out = append(out, Status{
			Version: s.Source.Version,
			Name:    baseName(s.Source.Path),
			Applied: s.State == goose.StateApplied,
		})
	}
	return out, nil
}

// Pending reports whether any migration is not yet applied; binaries refuse
// to start against an out-of-date schema.
func (m *Migrator) Pending(ctx context.Context) (bool, error) {
	p, err := m.provider.HasPending(ctx)
	if err != nil {
		return false, fmt.Errorf("checking for pending migrations: %w", err)
	}
	return p, nil
}

func versions(res []*goose.MigrationResult) []int64 {
	out := make([]int64, 0, len(res))
	for _, r := range res {
		if r != nil && r.Source != nil && r.Error == nil {
			out = append(out, r.Source.Version)
		}
	}
	return out
}

func baseName(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[i+1:]
		}
	}
	return p
}
