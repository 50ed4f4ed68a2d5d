package migrations_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/migrations"
)

// embedded is the number of migration files: the tests follow it, so that
// adding a migration never needs a constant changed here.
func embedded(t *testing.T) int {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(".", "*.sql"))
	if err != nil || len(m) == 0 {
		t.Fatalf("no migration files found (%v)", err)
	}
	return len(m)
}

func tables(t *testing.T, ctx context.Context, m interface {
	Status(context.Context) ([]migrations.Status, error)
}) (applied int) {
	t.Helper()
	st, err := m.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := embedded(t); len(st) != want {
		t.Fatalf("want %d migrations, got %d", want, len(st))
	}
	for _, s := range st {
		if s.Applied {
			applied++
		}
	}
	return applied
}

func TestUpDownUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testenv.BareDB(t)
	m, err := migrations.New(pool, testenv.SchemaOf(pool), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if n := tables(t, ctx, m); n != 0 {
		t.Fatalf("fresh schema has %d applied", n)
	}
	if p, _ := m.Pending(ctx); !p {
		t.Fatal("fresh schema should have pending migrations")
	}
	if v, err := m.Up(ctx); err != nil || len(v) != embedded(t) {
		t.Fatalf("up: %v %v", v, err)
	}
	if n := tables(t, ctx, m); n != embedded(t) {
		t.Fatalf("after up: %d applied", n)
	}
	for _, tbl := range []string{"billing_records", "spend_caps", "audit_runs", "audit_findings", "external_leases"} {
		var ok bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, tbl).Scan(&ok); err != nil || !ok {
			t.Fatalf("table %s missing after up (%v)", tbl, err)
		}
	}
	if v, err := m.Down(ctx); err != nil || len(v) != embedded(t) {
		t.Fatalf("down: %v %v", v, err)
	}
	var ok bool
	_ = pool.QueryRow(ctx, `SELECT to_regclass('billing_records') IS NOT NULL`).Scan(&ok)
	if ok || tables(t, ctx, m) != 0 {
		t.Fatal("down left billing_records behind")
	}
	if v, err := m.Up(ctx); err != nil || len(v) != embedded(t) {
		t.Fatalf("up again: %v %v", v, err)
	}
	if p, _ := m.Pending(ctx); p {
		t.Fatal("nothing should be pending")
	}
}

// Two `migrate up` at once: the advisory lock makes one wait, and the
// schema ends migrated exactly once.
func TestConcurrentUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testenv.BareDB(t)
	var wg sync.WaitGroup
	applied := make([]int, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := migrations.New(pool, testenv.SchemaOf(pool), nil)
			if err != nil {
				errs[i] = err
				return
			}
			defer m.Close()
			v, err := m.Up(ctx)
			applied[i], errs[i] = len(v), err
		}()
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	if want := embedded(t); applied[0]+applied[1] != want {
		t.Fatalf("migrations applied %v times, want %d in total", applied, want)
	}
}

// The schema makes bad states unrepresentable.
func TestConstraints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.DB(t)
	base := `INSERT INTO billing_records (customer_id, billing_period, stripe_customer_id, amount_cents, currency, idempotency_key, status, charge_id, charged_at, first_attempt_at, lease_owner, lease_expires_at) VALUES `
	bad := map[string]string{
		"zero amount":            `('c','p','cus_1',0,'usd','k1','pending',NULL,NULL,now(),NULL,NULL)`,
		"unknown status":         `('c','p','cus_1',1,'usd','k1','paid',NULL,NULL,now(),NULL,NULL)`,
		"charged without id":     `('c','p','cus_1',1,'usd','k1','charged',NULL,now(),now(),NULL,NULL)`,
		"pending with charge id": `('c','p','cus_1',1,'usd','k1','pending','ch_1',NULL,now(),NULL,NULL)`,
		"terminal holding lease": `('c','p','cus_1',1,'usd','k1','declined',NULL,NULL,now(),'w',now())`,
		"owner without expiry":   `('c','p','cus_1',1,'usd','k1','pending',NULL,NULL,now(),'w',NULL)`,
		"bad currency":           `('c','p','cus_1',1,'USD','k1','pending',NULL,NULL,now(),NULL,NULL)`,
		"charged without time":   `('c','p','cus_1',1,'usd','k1','charged','ch_1',NULL,now(),NULL,NULL)`,
	}
	for name, vals := range bad {
		if _, err := pool.Exec(ctx, base+vals); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := pool.Exec(ctx, base+`('c','p','cus_1',1,'usd','k1','charged','ch_1',now(),now(),NULL,NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, base+`('c2','p','cus_1',1,'usd','k1','pending',NULL,NULL,now(),NULL,NULL)`); err == nil {
		t.Error("duplicate idempotency key accepted")
	}
	if _, err := pool.Exec(ctx, base+`('c3','p','cus_1',1,'usd','k3','charged','ch_1',now(),now(),NULL,NULL)`); err == nil {
		t.Error("duplicate charge id accepted")
	}
	if _, err := pool.Exec(ctx, `INSERT INTO spend_caps (billing_period, cap_cents, reserved_cents) VALUES ('p', 10, 11)`); err == nil {
		t.Error("reservation above cap accepted")
	}
}

// 00006: the finding kinds the auditor stores, and a finding resolved by a
// run always says why.
func TestFindingConstraints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.DB(t)
	var run int64
	if err := pool.QueryRow(ctx, `INSERT INTO audit_runs (window_from, window_to) VALUES (now() - interval '1 hour', now()) RETURNING id`).Scan(&run); err != nil {
		t.Fatal(err)
	}
	ins := `INSERT INTO audit_findings (kind, subject, state, resolved_by_run_id, resolution) VALUES ($1, $2, $3, $4, $5)`
	for _, k := range []string{"disputed", "ambiguous_legacy", "duplicate_charge"} {
		if _, err := pool.Exec(ctx, ins, k, "s_"+k, "open", nil, nil); err != nil {
			t.Errorf("kind %s refused: %v", k, err)
		}
	}
	if _, err := pool.Exec(ctx, ins, "bogus", "s1", "open", nil, nil); err == nil {
		t.Error("unknown kind accepted")
	}
	if _, err := pool.Exec(ctx, ins, "orphan_charge", "s2", "open", run, "why"); err == nil {
		t.Error("an open finding resolved by a run accepted")
	}
	if _, err := pool.Exec(ctx, ins, "orphan_charge", "s3", "resolved", run, nil); err == nil {
		t.Error("a finding resolved by a run without a reason accepted")
	}
	if _, err := pool.Exec(ctx, ins, "orphan_charge", "s4", "resolved", run, "the ledger now records it"); err != nil {
		t.Errorf("a finding resolved by a run refused: %v", err)
	}
}

// 00014: meter events. A row needs a partition (there is no default one);
// the lease lives only while sending; delivered_at exactly when delivered;
// a parked or failed event says why; one slot per customer and meter.
func TestMeterConstraints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.DB(t)
	base := `INSERT INTO meter_events (event_ts, identifier, event_name, stripe_customer_id, value, status,
		first_sent_at, epoch, lease_owner, lease_expires_at, delivered_at, last_error, created_at) VALUES `
	row := func(ts, id, status, owner, exp, delivered, lastErr string) string {
		return fmt.Sprintf(`('%s', '%s', 'api_requests', 'cus_1', 3, '%s', now(), 1, %s, %s, %s, %s, now())`, ts, id, status, owner, exp, delivered, lastErr)
	}
	if _, err := pool.Exec(ctx, base+row("2026-11-30 12:00+00", "pg_1", "sending", "NULL", "NULL", "NULL", "NULL")); err == nil {
		t.Fatal("a row without a partition accepted")
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE meter_events_p20261130 PARTITION OF meter_events
		FOR VALUES FROM ('2026-11-30 00:00+00') TO ('2026-12-01 00:00+00')`); err != nil {
		t.Fatal(err)
	}
	ts := "2026-11-30 12:00+00"
	bad := map[string]string{
		"unknown status":          row(ts, "pg_1", "sent", "NULL", "NULL", "NULL", "NULL"),
		"delivered holding lease": row(ts, "pg_1", "delivered", "'w'", "now()", "now()", "NULL"),
		"owner without expiry":    row(ts, "pg_1", "sending", "'w'", "NULL", "NULL", "NULL"),
		"delivered without time":  row(ts, "pg_1", "delivered", "NULL", "NULL", "NULL", "NULL"),
		"sending with delivery":   row(ts, "pg_1", "sending", "NULL", "NULL", "now()", "NULL"),
		"parked without reason":   row(ts, "pg_1", "parked", "NULL", "NULL", "NULL", "NULL"),
		"failed without reason":   row(ts, "pg_1", "failed", "NULL", "NULL", "NULL", "NULL"),
		"long identifier":         row(ts, strings.Repeat("i", 101), "sending", "NULL", "NULL", "NULL", "NULL"),
		"next day's event":        row("2026-12-01 00:00+00", "pg_1", "sending", "NULL", "NULL", "NULL", "NULL"),
	}
	for name, vals := range bad {
		if _, err := pool.Exec(ctx, base+vals); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := pool.Exec(ctx, base+row(ts, "pg_1", "delivered", "NULL", "NULL", "now()", "NULL")); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, base+row(ts, "pg_1", "sending", "'w'", "now()", "NULL", "NULL")); err == nil {
		t.Error("a second row of one identifier accepted")
	}
	slot := `INSERT INTO meter_inflight (stripe_customer_id, event_name, identifier, event_ts, owner, expires_at, token)
		VALUES ('cus_1', 'api_requests', $1, now(), 'w', now(), $2)`
	if _, err := pool.Exec(ctx, slot, "pg_1", 7); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, slot, "pg_2", 8); err == nil {
		t.Error("a second slot of one customer and meter accepted")
	}
}

// Each schema has a migration lock of its own: a migration of one schema
// never waits for another's (tests migrate hundreds of schemas at once).
func TestMigrationLockIsPerSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	held, _ := testenv.BareDB(t)
	other, _ := testenv.BareDB(t)
	// Another process is migrating the first schema: it holds its lock.
	unlock, err := migrations.HoldLock(ctx, held, testenv.SchemaOf(held))
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	m, err := migrations.New(other, testenv.SchemaOf(other), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if v, err := m.Up(cctx); err != nil || len(v) != embedded(t) {
		t.Fatalf("migrating another schema while one is locked: %d applied, %v", len(v), err)
	}
	if migrations.LockID(testenv.SchemaOf(held)) == migrations.LockID(testenv.SchemaOf(other)) {
		t.Fatal("two schemas share a lock id")
	}
	// And the held schema's own migration does wait for that lock.
	mh, err := migrations.New(held, testenv.SchemaOf(held), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer mh.Close()
	sctx, scancel := context.WithTimeout(ctx, 3*time.Second)
	defer scancel()
	if v, err := mh.Up(sctx); err == nil {
		t.Fatalf("migrated %d past another migration's lock of the same schema", len(v))
	}
}

// 00019 back-fills meter_usage from the events already in the ledger: per
// meter, customer and month (UTC), the events sending, delivered or parked
// (a failed one counted nothing at Stripe).
func TestMeterUsageBackfill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testenv.BareDB(t)
	m, err := migrations.New(pool, testenv.SchemaOf(pool), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.UpTo(ctx, 18); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE meter_events_p202611 PARTITION OF meter_events FOR VALUES FROM ('2026-11-01 00:00+00') TO ('2026-12-01 00:00+00')`,
		`CREATE TABLE meter_events_p202612 PARTITION OF meter_events FOR VALUES FROM ('2026-12-01 00:00+00') TO ('2027-01-01 00:00+00')`,
		`INSERT INTO meter_events (event_ts, identifier, event_name, stripe_customer_id, value, status, first_sent_at, epoch, created_at,
			delivered_at, last_error) VALUES
			('2026-11-30 23:59:59+00', 'a', 'api', 'cus_1', 3, 'delivered', now(), 1, now(), now(), NULL),
			('2026-11-30 10:00+00', 'b', 'api', 'cus_1', 4, 'sending', now(), 1, now(), NULL, NULL),
			('2026-11-30 11:00+00', 'c', 'api', 'cus_1', 5, 'failed', now(), 1, now(), NULL, 'refused'),
			('2026-11-30 12:00+00', 'd', 'api', 'cus_1', 2, 'parked', now(), 1, now(), NULL, 'unknown'),
			('2026-12-01 00:00+00', 'e', 'api', 'cus_1', 7, 'delivered', now(), 1, now(), now(), NULL),
			('2026-11-30 12:00+00', 'f', 'logins', 'cus_1', 1, 'delivered', now(), 1, now(), now(), NULL)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT event_name || ' ' || stripe_customer_id || ' ' || to_char(month, 'YYYY-MM') || ' ' || units || '/' || events
		FROM meter_usage ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"api cus_1 2026-11 9/3", "api cus_1 2026-12 7/1", "logins cus_1 2026-11 1/1"}
	if !slices.Equal(got, want) {
		t.Fatalf("meter_usage after 00019: %v, want %v", got, want)
	}
}
