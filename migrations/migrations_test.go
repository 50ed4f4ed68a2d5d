package migrations_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

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
