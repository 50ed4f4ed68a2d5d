package migrations

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/internal/pg"
)

// Tables are pelguard's tables, the ones MoveSchema moves. Nothing else in
// a database is pelguard's. tablesOf says which migration creates each:
// MoveSchema moves only the tables of migrations applied in the schema it
// moves from, so a team's own table that happens to share a name with a
// later migration's (a refund_ledger of theirs) is never taken.
var Tables = []string{"billing_records", "spend_caps", "audit_runs", "audit_findings", "import_runs", "imported_periods", "refund_ledger", "external_leases", "webhook_events", "audit_stage", "audit_pending", "console_actions", "ledger_witness", "ledger_fence", "ledger_rollbacks", "meter_events", "meter_inflight", "usage_runs", "usage_stage", "usage_findings", "usage_corrections", "console_sessions", "console_login_attempts", "console_keys", "meter_usage", "meter_caps", "run_leases", "stream_namespaces", "stream_pauses", "stream_fact_changes", "usage_compared", "meter_send_fence", "meter_aggregates", VersionTable, LockTable}

// State is what Check read about a schema. Reading it writes nothing: not
// even goose's version table, which goose itself creates on every call.
type State struct {
	Schema string
	// Migrations lists every embedded migration, applied or not.
	Migrations []Status
	// LegacySchema, when set, names the schema an earlier pelguard (which
	// named no schema) made its ledger in — the connection's current_schema(),
	// public for most URLs — while Schema holds none.
	LegacySchema string
}

// Pending reports whether a migration is not applied.
func (s State) Pending() bool {
	return slices.ContainsFunc(s.Migrations, func(m Status) bool { return !m.Applied })
}

var tablesOf = map[string]int64{
	"billing_records": 1, "spend_caps": 1, "audit_runs": 2, "audit_findings": 2,
	"import_runs": 4, "imported_periods": 4, "refund_ledger": 5, "external_leases": 7, "webhook_events": 8, "audit_stage": 9,
	"audit_pending": 9, "console_actions": 10, "ledger_witness": 12, "ledger_fence": 12, "ledger_rollbacks": 12,
	"meter_events": 14, "meter_inflight": 14,
	"usage_runs": 15, "usage_stage": 15, "usage_findings": 15, "usage_corrections": 15,
	"console_sessions": 16, "console_login_attempts": 16, "console_keys": 16,
	"meter_usage": 19, "meter_caps": 19, "run_leases": 20,
	"stream_namespaces": 24, "stream_pauses": 24, "stream_fact_changes": 24,
	"meter_send_fence": 27, "meter_aggregates": 28,
	"usage_compared": 30,
}

// ErrLegacyLedger is wrapped by State.Err when the ledger sits in another
// schema (an earlier version's public).
var ErrLegacyLedger = errors.New("pelguard's ledger is in another schema")

// ErrNotMigrated is wrapped by State.Err when migrations are pending.
var ErrNotMigrated = errors.New("the ledger schema is not up to date")

// Err is nil when the schema is ready to run on, and otherwise an error that
// names the one command that fixes it (prog is the binary's name).
func (s State) Err(prog string) error {
	switch {
	case s.LegacySchema != "":
		return fmt.Errorf("%w: pelguard's tables are in schema %q (made by an earlier version) and schema %q has none; "+
			"move them, in one transaction that touches nothing else, with `%s migrate move --from %s --db-schema %s` "+
			"(pelguard refuses to start an empty second ledger beside them)",
			ErrLegacyLedger, s.LegacySchema, s.Schema, prog, s.LegacySchema, s.Schema)
	case s.Pending():
		return fmt.Errorf("%w (schema %q): run `%s migrate up --db-schema %s` first", ErrNotMigrated, s.Schema, prog, s.Schema)
	}
	return nil
}

// Check reads the migration state of schema (empty: DefaultSchema) without
// writing anything.
func Check(ctx context.Context, pool *pgxpool.Pool, schema string) (State, error) {
	if schema == "" {
		schema = DefaultSchema
	}
	st := State{Schema: schema}
	applied, has, err := appliedVersions(ctx, pool, schema)
	if err != nil {
		return st, err
	}
	all, err := embedded()
	if err != nil {
		return st, err
	}
	for _, m := range all {
		m.Applied = applied[m.Version]
		st.Migrations = append(st.Migrations, m)
	}
	if !has && len(applied) == 0 {
		// An earlier version named no schema: its tables went wherever the
		// connection's search_path put them (public, for most URLs).
		var cur *string
		if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&cur); err != nil {
			return st, fmt.Errorf("reading current_schema(): %w", err)
		}
		if cur != nil && *cur != schema {
			legacy, err := isPelguardLedger(ctx, pool, *cur)
			if err != nil {
				return st, err
			}
			if legacy {
				st.LegacySchema = *cur
			}
		}
	}
	return st, nil
}

// appliedVersions reads goose's version table in schema, if there is one.
func appliedVersions(ctx context.Context, pool *pgxpool.Pool, schema string) (map[int64]bool, bool, error) {
	var exists bool
	table := pgx.Identifier{schema, VersionTable}.Sanitize()
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil {
		return nil, false, fmt.Errorf("looking for %s: %w", table, err)
	}
	if !exists {
		return map[int64]bool{}, false, nil
	}
	rows, err := pool.Query(ctx, `SELECT version_id FROM `+table+` WHERE is_applied AND version_id > 0`)
	if err != nil {
		return nil, true, fmt.Errorf("reading %s: %w", table, err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, true, fmt.Errorf("reading %s: %w", table, err)
	}
	out := map[int64]bool{}
	for _, v := range vs {
		out[v] = true
	}
	return out, true, nil
}

// isPelguardLedger reports whether schema holds a ledger pelguard made: a
// version table with migration 1 applied, and a billing_records with
// pelguard's fencing column. A team's own billing_records (the article's
// shape) has no epoch column; the version table an earlier version left
// behind when its first migration failed on that table has nothing applied.
func isPelguardLedger(ctx context.Context, pool *pgxpool.Pool, schema string) (bool, error) {
	applied, has, err := appliedVersions(ctx, pool, schema)
	if err != nil || !has || !applied[1] {
		return false, err
	}
	var ok bool
	err = pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
		WHERE table_schema = $1 AND table_name = 'billing_records' AND column_name = 'epoch')`, schema).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("inspecting %s.billing_records: %w", schema, err)
	}
	return ok, nil
}

// embedded lists the migrations in this build.
func embedded() ([]Status, error) {
	entries, err := fs.ReadDir(files, ".")
	if err != nil {
		return nil, err
	}
	var out []Status
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		if !ok || !strings.HasSuffix(name, ".sql") {
			continue
		}
		v, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("migration file %s: %w", name, err)
		}
		out = append(out, Status{Version: v, Name: name})
	}
	slices.SortFunc(out, func(a, b Status) int { return int(a.Version - b.Version) })
	return out, nil
}

// MoveSchema moves a ledger an earlier pelguard made in from (public) into
// to, in one transaction: `ALTER TABLE … SET SCHEMA` for each of pelguard's
// tables (their indexes and sequences go with them) and each partition of
// a partitioned one. It refuses unless from holds pelguard's ledger and to
// holds none of pelguard's tables, so it can never move a table of the
// team's.
func MoveSchema(ctx context.Context, pool *pgxpool.Pool, from, to string) ([]string, error) {
	for _, s := range []string{from, to} {
		if err := pg.ValidSchema(s); err != nil {
			return nil, err
		}
	}
	if from == to {
		return nil, fmt.Errorf("--from %s is the target schema already", from)
	}
	ok, err := isPelguardLedger(ctx, pool, from)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("schema %q holds no ledger of pelguard's (no applied %s, or a billing_records without pelguard's columns): nothing moved", from, VersionTable)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{to}.Sanitize()); err != nil {
		return nil, fmt.Errorf("creating schema %s: %w", to, err)
	}
	applied, _, err := appliedVersions(ctx, pool, from)
	if err != nil {
		return nil, err
	}
	var moved []string
	for _, t := range Tables {
		if v, ok := tablesOf[t]; ok && !applied[v] {
			continue // not made by pelguard in from: whatever has this name there is not ours
		}
		var inFrom, inTo bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL`,
			pgx.Identifier{from, t}.Sanitize(), pgx.Identifier{to, t}.Sanitize()).Scan(&inFrom, &inTo); err != nil {
			return nil, err
		}
		if inTo {
			return nil, fmt.Errorf("schema %q already has a %s: nothing moved", to, t)
		}
		if !inFrom {
			continue
		}
		// A partitioned table's partitions (meter_events' days) are tables
		// of their own: SET SCHEMA on the parent leaves them behind.
		rows, err := tx.Query(ctx, `SELECT c.relname::text FROM pg_inherits i
			JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE i.inhparent = to_regclass($1) AND n.nspname = $2 ORDER BY 1`, pgx.Identifier{from, t}.Sanitize(), from)
		if err != nil {
			return nil, fmt.Errorf("listing the partitions of %s.%s: %w", from, t, err)
		}
		parts, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("listing the partitions of %s.%s: %w", from, t, err)
		}
		for _, name := range append([]string{t}, parts...) {
			if _, err := tx.Exec(ctx, "ALTER TABLE "+pgx.Identifier{from, name}.Sanitize()+" SET SCHEMA "+pgx.Identifier{to}.Sanitize()); err != nil {
				return nil, fmt.Errorf("moving %s.%s: %w", from, name, err)
			}
		}
		moved = append(moved, t)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	return moved, nil
}
