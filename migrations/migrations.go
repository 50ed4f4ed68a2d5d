// Package migrations holds pelguard's Postgres schema as numbered, embedded
// SQL files and applies them with goose. Every binary exposes them as
// `migrate up|down|status`.
//
// Two `migrate up` at once are safe: goose holds a lease row of the
// schema's own (LockTable, renewed while it works) for the whole run, so the
// second waits and then finds nothing to do; other schemas of the database
// never wait for it.
package migrations

import (
	"cmp"
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"
	"strings"
	"time"

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

// LockTable is goose's migration lock, a table in pelguard's schema.
const LockTable = "pelguard_migration_lock"

// ErrWrongSchema is wrapped by Up and Down when a migration's transaction
// does not resolve names to pelguard's schema: the migration is rolled back
// and nothing is applied.
var ErrWrongSchema = errors.New("a migration would not land in pelguard's schema")

// Migrator applies pelguard's migrations to one schema of a database.
type Migrator struct {
	db       *sql.DB
	pool     *pgxpool.Pool
	schema   string
	provider *goose.Provider
}

// New builds a Migrator for schema (empty: DefaultSchema) over the database
// pool reaches. Each migration runs in a transaction that first sets
// search_path to that schema alone (SET LOCAL) and checks current_schema(),
// so an unqualified name in a migration can only ever mean pelguard's
// table, never one of the team's: the same behind a transaction-mode
// connection pooler, which hands each transaction a server connection of
// its own and may drop (or refuse) a search_path given at connect time.
// goose's version table and its lock are named with the schema. Close
// releases the Migrator's connections (the pool itself stays open).
func New(pool *pgxpool.Pool, schema string, logger *slog.Logger) (*Migrator, error) {
	schema = cmp.Or(schema, DefaultSchema)
	if err := pg.ValidSchema(schema); err != nil {
		return nil, err
	}
	migs, err := goMigrations(schema)
	if err != nil {
		return nil, err
	}
	// A table lock, not a session advisory lock: behind a pooler a session
	// lock stays with the pooler's server connection. One lock row per
	// schema: two `migrate up` of one schema still run one after the
	// other, but schemas never wait on each other.
	locker, err := lock.NewPostgresTableLocker(
		lock.WithTableName(schema+"."+LockTable),
		lock.WithTableLockID(lockID(schema)),
		lock.WithTableLockTimeout(500*time.Millisecond, 1200), // polls for up to 10 minutes
	)
	if err != nil {
		return nil, fmt.Errorf("creating migration lock: %w", err)
	}
	cc := pool.Config().ConnConfig.Copy()
	db := stdlib.OpenDB(*cc)
	opts := []goose.ProviderOption{
		goose.WithLocker(locker),
		goose.WithTableName(schema + "." + VersionTable), // ValidSchema: never needs quoting
		goose.WithDisableGlobalRegistry(true),
		goose.WithGoMigrations(migs...),
	}
	if logger != nil {
		opts = append(opts, goose.WithSlog(logger))
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, nil, opts...)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("loading migrations: %w", err)
	}
	return &Migrator{db: db, pool: pool, schema: schema, provider: p}, nil
}

// goMigrations turns each embedded SQL file into a goose Go migration
// whose up and down run in schema (inSchema).
func goMigrations(schema string) ([]*goose.Migration, error) {
	entries, err := fs.Glob(files, "*.sql")
	if err != nil {
		return nil, err
	}
	var out []*goose.Migration
	for _, name := range entries {
		v, err := goose.NumericComponent(name)
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", name, err)
		}
		body, err := fs.ReadFile(files, name)
		if err != nil {
			return nil, err
		}
		up, down, err := splitSQL(string(body))
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", name, err)
		}
		out = append(out, goose.NewGoMigration(v,
			&goose.GoFunc{RunTx: inSchema(schema, up)}, &goose.GoFunc{RunTx: inSchema(schema, down)}))
	}
	return out, nil
}

// splitSQL returns a migration file's Up and Down sections. The files use
// no StatementBegin/End and no NO TRANSACTION: each section runs as one
// multi-statement Exec (pgx's simple protocol, as a statement without
// arguments always does).
func splitSQL(body string) (up, down string, err error) {
	_, rest, ok := strings.Cut(body, "-- +goose Up\n")
	if !ok {
		return "", "", errors.New("no -- +goose Up")
	}
	up, down, ok = strings.Cut(rest, "-- +goose Down\n")
	if !ok {
		return "", "", errors.New("no -- +goose Down")
	}
	if strings.Contains(body, "+goose StatementBegin") || strings.Contains(body, "+goose NO TRANSACTION") {
		return "", "", errors.New("goose annotations other than Up and Down are not supported here")
	}
	return up, down, nil
}

// inSchema runs stmts in tx with search_path set to schema alone, after
// checking that the transaction resolves names there.
func inSchema(schema, stmts string) func(context.Context, *sql.Tx) error {
	quoted := pgx.Identifier{schema}.Sanitize()
	return func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, "SET LOCAL search_path TO "+quoted); err != nil {
			return fmt.Errorf("setting search_path to %s: %w", quoted, err)
		}
		var cur sql.NullString
		if err := tx.QueryRowContext(ctx, "SELECT current_schema()").Scan(&cur); err != nil {
			return fmt.Errorf("reading current_schema(): %w", err)
		}
		if cur.String != schema {
			return fmt.Errorf("%w: current_schema() is %q, not %q, after SET LOCAL search_path in the migration's own transaction; "+
				"a connection pooler that does not keep a transaction on one server connection (PgBouncer in statement mode?) "+
				"cannot run migrations: run 'migrate up' with a DATABASE_URL straight to Postgres (or through a pooler in transaction or session mode)",
				ErrWrongSchema, cur.String, schema)
		}
		if strings.TrimSpace(stmts) == "" {
			return nil
		}
		_, err := tx.ExecContext(ctx, stmts)
		return err
	}
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

// lockID is schema's row in its migration lock table, derived from its
// name.
func lockID(schema string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("pelguard-migrate:" + schema))
	return int64(h.Sum64() >> 1)
}
