package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/internal/testkit/teamsys"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/migrations"
)

func snapshot(t *testing.T, pool *pgxpool.Pool, schemas ...string) string {
	t.Helper()
	return testenv.Snapshot(t, pool, schemas...)
}

// A team's database: its own billing_records (the article's shape, with
// rows) in the schema its URL selects. Checking, migrating up, status and
// down in pelguard's schema never change that table, and nothing is created
// outside pelguard's schema; checking and status create nothing at all.
func TestMigrationsNeverTouchTheTeamsTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testenv.BareDB(t)
	team := testenv.SchemaOf(pool) // the team's "public": the URL's search_path
	pel := "pel_" + testenv.Suffix()
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pel+" CASCADE") })
	if err := teamsys.CreateTable(ctx, pool, team); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO billing_records (customer_id, billing_period, charge_id, amount_cents, status)
		VALUES ('c_1', '2026-11', 'ch_1', 2500, 'charged'), ('c_2', '2026-11', NULL, 900, 'card_declined')`); err != nil {
		t.Fatal(err)
	}
	teamBefore := snapshot(t, pool, team)
	if !strings.Contains(teamBefore, team+".billing_records") || !strings.Contains(teamBefore, "card_declined") {
		t.Fatalf("the team's table is not in the snapshot:\n%s", teamBefore)
	}
	assertTeamUntouched := func(step string) {
		t.Helper()
		if got := snapshot(t, pool, team); got != teamBefore {
			t.Fatalf("%s changed the team's schema:\nbefore:\n%s\nafter:\n%s", step, teamBefore, got)
		}
	}

	st, err := migrations.Check(ctx, pool, pel)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Pending() || st.LegacySchema != "" || !errors.Is(st.Err("consumer"), migrations.ErrNotMigrated) {
		t.Fatalf("fresh database: pending %v, legacy %q, err %v", st.Pending(), st.LegacySchema, st.Err("consumer"))
	}
	m, err := migrations.New(pool, pel, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.Status(ctx); err != nil {
		t.Fatal(err)
	}
	if pending, err := m.Pending(ctx); err != nil || !pending {
		t.Fatalf("Pending before up: %v %v", pending, err)
	}
	if got := snapshot(t, pool, pel); got != "schemas: \n" {
		t.Fatalf("check and status created something (a dry run must write nothing):\n%s", got)
	}
	assertTeamUntouched("check and status")

	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	assertTeamUntouched("migrate up")
	after := snapshot(t, pool, pel)
	for _, tbl := range migrations.Tables {
		if !strings.Contains(after, pel+"."+tbl+":r:") && !strings.Contains(after, pel+"."+tbl+":p:") {
			t.Fatalf("%s.%s missing after up:\n%s", pel, tbl, after)
		}
	}
	// Every table the migrations make is listed, or `migrate move` would
	// leave it behind (partitions move with their table).
	rows, err := pool.Query(ctx, `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND NOT c.relispartition ORDER BY 1`, pel)
	if err != nil {
		t.Fatal(err)
	}
	made, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	listed := slices.Sorted(slices.Values(migrations.Tables))
	if !slices.Equal(made, listed) {
		t.Fatalf("the migrations make tables %v; migrations.Tables lists %v", made, listed)
	}
	if st, _ := migrations.Check(ctx, pool, pel); st.Err("consumer") != nil {
		t.Fatalf("after up: %v", st.Err("consumer"))
	}
	if _, err := m.Down(ctx); err != nil {
		t.Fatal(err)
	}
	assertTeamUntouched("migrate down")
	if got := snapshot(t, pool, pel); strings.Contains(got, pel+".billing_records") {
		t.Fatalf("down left pelguard's ledger behind:\n%s", got)
	}
}

// A ledger an earlier version made where the URL's search_path pointed (no
// schema of its own): Check refuses to start an empty second ledger beside
// it and names the move command; MoveSchema moves pelguard's tables, data
// and all, in one transaction; it refuses to move a team's table.
func TestLegacyLedgerIsRefusedThenMoved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testenv.BareDB(t)
	old := testenv.SchemaOf(pool)
	pel := "pel_" + testenv.Suffix()
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pel+" CASCADE") })
	m, err := migrations.New(pool, old, nil) // the earlier version's layout
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO spend_caps (billing_period, cap_cents) VALUES ('2026-11', 12345)`); err != nil {
		t.Fatal(err)
	}
	// A partition of meter_events is a table of its own: it moves too.
	for _, q := range []string{
		`CREATE TABLE meter_events_p20261130 PARTITION OF meter_events FOR VALUES FROM ('2026-11-30 00:00+00') TO ('2026-12-01 00:00+00')`,
		`INSERT INTO meter_events (event_ts, identifier, event_name, stripe_customer_id, value, first_sent_at, epoch, created_at)
			VALUES ('2026-11-30 12:00+00', 'pg_1', 'api_requests', 'cus_1', 3, now(), 1, now())`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	st, err := migrations.Check(ctx, pool, pel)
	if err != nil {
		t.Fatal(err)
	}
	err = st.Err("consumer")
	want := fmt.Sprintf("consumer migrate move --from %s --db-schema %s", old, pel)
	if st.LegacySchema != old || !errors.Is(err, migrations.ErrLegacyLedger) || !strings.Contains(err.Error(), want) {
		t.Fatalf("legacy %q, err %v; want the command %q", st.LegacySchema, err, want)
	}
	if got := snapshot(t, pool, pel); got != "schemas: \n" {
		t.Fatalf("the check created something:\n%s", got)
	}

	moved, err := migrations.MoveSchema(ctx, pool, old, pel)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(moved)
	wantMoved := slices.Clone(migrations.Tables)
	slices.Sort(wantMoved)
	if !slices.Equal(moved, wantMoved) {
		t.Fatalf("moved %v, want %v", moved, wantMoved)
	}
	if st, err := migrations.Check(ctx, pool, pel); err != nil || st.Err("consumer") != nil {
		t.Fatalf("after the move: %v %v", err, st.Err("consumer"))
	}
	var cents int64
	if err := pool.QueryRow(ctx, `SELECT cap_cents FROM `+pel+`.spend_caps WHERE billing_period = '2026-11'`).Scan(&cents); err != nil || cents != 12345 {
		t.Fatalf("the cap did not move with its table: %d %v", cents, err)
	}
	if got := snapshot(t, pool, old); strings.Contains(got, ".billing_records") || strings.Contains(got, ".meter_events") {
		t.Fatalf("the old schema still has a ledger:\n%s", got)
	}
	var value int64
	if err := pool.QueryRow(ctx, `SELECT value FROM `+pel+`.meter_events_p20261130`).Scan(&value); err != nil || value != 3 {
		t.Fatalf("the partition did not move with its table: %d %v", value, err)
	}

	// A team's billing_records (and a leftover version table with nothing
	// applied, as a failed earlier `migrate up` left) is not pelguard's.
	if err := teamsys.CreateTable(ctx, pool, old); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.MoveSchema(ctx, pool, old, "pel_other_"+testenv.Suffix()); err == nil {
		t.Fatal("MoveSchema moved a schema that holds no pelguard ledger")
	}
}

// A team's own table named like a later migration's (refund_ledger) in the
// schema an earlier pelguard used is not pelguard's: migrate move leaves it.
func TestMoveLeavesATeamsTableOfALaterMigrationsName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testenv.BareDB(t)
	old := testenv.SchemaOf(pool)
	pel := "pel_" + testenv.Suffix()
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pel+" CASCADE") })
	m, err := migrations.New(pool, old, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	// An earlier version: only migrations 1–3 applied; the team owns a
	// refund_ledger of its own.
	for _, q := range []string{
		`DROP TABLE refund_ledger CASCADE`,
		`DELETE FROM pelguard_schema_migrations WHERE version_id > 3`,
		`CREATE TABLE refund_ledger (team_column text)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	moved, err := migrations.MoveSchema(ctx, pool, old, pel)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(moved, "refund_ledger") || !slices.Contains(moved, "billing_records") {
		t.Fatalf("moved %v: want pelguard's tables of migrations 1–3, not the team's refund_ledger", moved)
	}
	var ok bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, old+".refund_ledger").Scan(&ok); err != nil || !ok {
		t.Fatalf("the team's refund_ledger left %s (%v)", old, err)
	}
}
