package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/teamsys"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/migrations"
)

// A team's database, its own billing_records (the article's table, with
// rows) in public, and the binaries run as the README says: migrate status,
// the reaper's and the refund dry runs, migrate up, the dry runs again,
// migrate down. The team's table never changes, nothing is created outside
// pelguard's schema, and the dry runs and status create nothing at all.
func TestBinariesNeverTouchTheTeamsDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, dbURL := testenv.FreshDatabase(t)
	if err := teamsys.CreateTable(ctx, pool, "public"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO public.billing_records (customer_id, billing_period, charge_id, amount_cents, status)
		VALUES ('c_1', '2026-11', 'ch_1', 2500, 'charged'), ('c_2', '2026-11', NULL, 900, 'card_declined')`); err != nil {
		t.Fatal(err)
	}
	sim := stripesim.MustNew(stripesim.Config{})
	t.Cleanup(sim.Close)
	rdb := testenv.Redis(t)
	stream := testenv.Name(t, "billing")
	testenv.CleanupKeys(t, rdb, stream)
	env := baseEnv("DATABASE_URL="+dbURL, "REDIS_URL="+testenv.RedisURL(), "STRIPE_API_KEY="+testKey, "STRIPE_API_BASE="+sim.URL())
	team := testenv.Snapshot(t, pool, "public")
	empty := testenv.Snapshot(t, pool, migrations.DefaultSchema)
	same := func(step string) {
		t.Helper()
		if got := testenv.Snapshot(t, pool, "public"); got != team {
			t.Fatalf("%s changed public:\nbefore:\n%s\nafter:\n%s", step, team, got)
		}
	}
	dryRuns := func(step string, wantCode int) {
		t.Helper()
		before := testenv.Snapshot(t, pool, migrations.DefaultSchema)
		reaper := runBin(t, "reaper", env, time.Minute, "--dry-run", "--once", "--metrics-addr", "", "--stream", stream, "--group", "g")
		refund := runBin(t, "auditor", env, time.Minute, "refund", "--all", "--dry-run")
		for _, r := range []result{reaper, refund} {
			if r.code != wantCode {
				t.Fatalf("%s: exit %d, want %d:\n%s", step, r.code, wantCode, r.out)
			}
			if wantCode != 0 && !strings.Contains(r.out, "migrate up") {
				t.Fatalf("%s: the refusal does not name `migrate up`:\n%s", step, r.out)
			}
		}
		if r := runBin(t, "consumer", env, time.Minute, "migrate", "status"); r.code != 0 {
			t.Fatalf("%s: migrate status: exit %d\n%s", step, r.code, r.out)
		}
		same(step)
		if got := testenv.Snapshot(t, pool, migrations.DefaultSchema); got != before {
			t.Fatalf("%s wrote to pelguard's schema:\nbefore:\n%s\nafter:\n%s", step, before, got)
		}
	}

	dryRuns("dry runs before migrate up", 2)
	if got := testenv.Snapshot(t, pool, migrations.DefaultSchema); got != empty {
		t.Fatalf("dry runs created pelguard's schema:\n%s", got)
	}
	if r := runBin(t, "consumer", env, time.Minute, "migrate", "up"); r.code != 0 {
		t.Fatalf("migrate up: %d\n%s", r.code, r.out)
	}
	same("migrate up")
	if got := testenv.Snapshot(t, pool, migrations.DefaultSchema); !strings.Contains(got, "pelguard.billing_records:r:") {
		t.Fatalf("migrate up made no ledger in pelguard:\n%s", got)
	}
	dryRuns("dry runs after migrate up", 0)
	if r := runBin(t, "consumer", env, time.Minute, "migrate", "down", "--yes"); r.code != 0 {
		t.Fatalf("migrate down: %d\n%s", r.code, r.out)
	}
	same("migrate down")
}

// A ledger an earlier version left in public: every binary refuses to start
// and prints the one command that moves it; that command moves it, and the
// binaries start.
func TestLedgerInPublicIsRefusedWithTheMoveCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, dbURL := testenv.FreshDatabase(t)
	m, err := migrations.New(pool, "public", nil) // what an earlier version did
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	_ = m.Close()
	sim := stripesim.MustNew(stripesim.Config{})
	t.Cleanup(sim.Close)
	env := baseEnv("DATABASE_URL="+dbURL, "REDIS_URL="+testenv.RedisURL(), "STRIPE_API_KEY="+testKey, "STRIPE_API_BASE="+sim.URL())
	stream := testenv.Name(t, "billing")
	testenv.CleanupKeys(t, testenv.Redis(t), stream)
	const move = "migrate move --from public --db-schema pelguard"
	runs := map[string][]string{
		"consumer": {"--stream", stream, "--group", "g", "--metrics-addr", ""},
		"reaper":   {"--once", "--stream", stream, "--group", "g", "--metrics-addr", ""},
		"auditor":  {"run", "--from", "2026-11-01", "--to", "2026-11-02"},
	}
	for bin, args := range runs {
		r := runBin(t, bin, env, time.Minute, args...)
		if r.code != 2 || !strings.Contains(r.out, bin+" "+move) {
			t.Fatalf("%s with the ledger in public: exit %d, want 2 and `%s %s`:\n%s", bin, r.code, bin, move, r.out)
		}
	}
	if r := runBin(t, "consumer", env, time.Minute, "migrate", "up"); r.code != 2 || !strings.Contains(r.out, move) {
		t.Fatalf("migrate up beside a ledger in public must refuse, not make a second ledger: %d\n%s", r.code, r.out)
	}
	if r := runBin(t, "consumer", env, time.Minute, strings.Fields(move)...); r.code != 0 || !strings.Contains(r.out, "moved public.billing_records") {
		t.Fatalf("%s: %d\n%s", move, r.code, r.out)
	}
	if r := runBin(t, "reaper", env, time.Minute, runs["reaper"]...); r.code != 0 {
		t.Fatalf("reaper after the move: %d\n%s", r.code, r.out)
	}
}
