// Package migrations holds pelguard's Postgres schema as numbered, embedded
// SQL files and applies them with goose. Every binary exposes them as
// `migrate up|down|status`.
//
// Two `migrate up` at once are safe: goose holds a Postgres session advisory
// lock of the schema's own for the whole run, so the second waits and then
// finds nothing to do; other schemas of the database never wait for it.
package migrations

import (
	"cmp"
	"context"
	"database/sql"
	"embed"
	"fmt"
	"hash/fnv"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/pelguard/pelguard/internal/pg"
)

//go:embed *.sql
var files embed.FS

// VersionTable is where goose records which migrations have been applied,
// in pelguard's schema.
const VersionTable = "pelguard_schema_migrations"

// DefaultSchema is the schema pelguard's tables live in unless configured
// (--db-schema, PELGUARD_DB_SCHEMA).
const DefaultSchema = pg.DefaultSchema

// Status is one migration's state.
type Status struct {
	Version int64
	Name    string
	Applied bool
}

// Migrator applies pelguard's migrations to one schema of a database.
type Migrator struct {
	db       *sql.DB
	pool     *pgxpool.Pool
	schema   string
	provider *goose.Provider
}

// New builds a Migrator for schema (empty: DefaultSchema) over the database
// pool reaches. The migrations run on connections of their own whose
// search_path is that schema alone, so an unqualified name in a migration
// can only ever mean pelguard's table, never one of the team's. Close
// releases those connections (the pool itself stays open).
func New(pool *pgxpool.Pool, schema string, logger *slog.Logger) (*Migrator, error) {
	schema = cmp.Or(schema, DefaultSchema)
	if err := pg.ValidSchema(schema); err != nil {
		return nil, err
	}
	// One lock per schema: two `migrate up` of one schema still run one
	// after the other, but schemas never wait on each other (goose's
	// default lock id is one for the whole database).
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID(schema)))
	if err != nil {
		return nil, fmt.Errorf("creating migration lock: %w", err)
	}
	cc := pool.Config().ConnConfig.Copy()
	cc.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize()
	db := stdlib.OpenDB(*cc)
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
	return &Migrator{db: db, pool: pool, schema: schema, provider: p}, nil
}

// Close releases the migrator's database handle.
func (m *Migrator) Close() error { return m.db.Close() }

// Up creates the schema if it is missing, then applies every pending
// migration and returns the versions applied.
func (m *Migrator) Up(ctx context.Context) ([]int64, error) {
	if _, err := m.pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{m.schema}.Sanitize()); err != nil {
		return nil, fmt.Errorf("creating schema %s: %w", m.schema, err)
	}
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

// Schema is the schema the migrator works on.
func (m *Migrator) Schema() string { return m.schema }

// Status lists every known migration and whether it is applied. It writes
// nothing (see Check).
func (m *Migrator) Status(ctx context.Context) ([]Status, error) {
	st, err := Check(ctx, m.pool, m.schema)
	if err != nil {
		return nil, err
	}
	return st.Migrations, nil
}

// Pending reports whether any migration is not yet applied; binaries refuse
// to start against an out-of-date schema. It writes nothing.
func (m *Migrator) Pending(ctx context.Context) (bool, error) {
	st, err := Check(ctx, m.pool, m.schema)
	if err != nil {
		return false, err
	}
	return st.Pending(), nil
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

// lockID is schema's migration lock: a session advisory lock id derived
// from its name.
func lockID(schema string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("pelguard-migrate:" + schema))
	return int64(h.Sum64() >> 1)
}
