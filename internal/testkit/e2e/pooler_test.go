package e2e

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/pgbouncer"
	"github.com/pelguard/pelguard/internal/testkit/teamsys"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/migrations"
)

// poolers are the two PgBouncer configurations teams run: the stock one,
// which refuses a search_path in the URL, and the one many guides give
// (ignore_startup_parameters with search_path), which drops it silently.
var poolers = []struct {
	name string
	cfg  pgbouncer.Config
}{
	{"stock", pgbouncer.Config{}},
	{"ignore_search_path", pgbouncer.Config{IgnoreSearchPath: true}},
}

// dbName is the database a postgres URL names.
func dbName(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}

// inDatabase points the pooler's URL at the test's own database.
func inDatabase(t *testing.T, poolerURL, db string) string {
	t.Helper()
	u, err := url.Parse(poolerURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + db
	return u.String()
}

// idleAdvisoryLocks counts advisory locks held by idle backends of db:
// what a session lock left in a pooler's server connection looks like.
func idleAdvisoryLocks(t *testing.T, pool *pgxpool.Pool, db string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND a.datname = $1 AND a.state = 'idle'`, db).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Through PgBouncer in transaction mode, in either configuration,
// `migrate up` puts every table in pelguard's schema (the default or
// another --db-schema) and never touches the team's public, whose
// billing_records stays as it was; a URL search_path the stock pooler
// refuses is refused with the fix named.
func TestMigrateThroughPgBouncer(t *testing.T) {
	for _, p := range poolers {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := pgbouncer.Start(t, p.cfg)
			pool, dbURL := testenv.FreshDatabase(t)
			if err := teamsys.CreateTable(ctx, pool, "public"); err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `INSERT INTO public.billing_records (customer_id, billing_period, charge_id, amount_cents, status)
				VALUES ('c_1', '2026-11', 'ch_1', 2500, 'charged')`); err != nil {
				t.Fatal(err)
			}
			team := testenv.Snapshot(t, pool, "public")
			via := inDatabase(t, b.URL(""), dbName(t, dbURL))
			for _, schema := range []string{migrations.DefaultSchema, "billing_x"} {
				// The URL a team has: search_path naming pelguard's schema.
				withPath := via + "&search_path=" + schema
				env := baseEnv("DATABASE_URL="+withPath, "PELGUARD_DB_SCHEMA="+schema)
				r := runBin(t, "consumer", env, 2*time.Minute, "migrate", "up", "--wait-for-deps", "0")
				if p.cfg.IgnoreSearchPath {
					if r.code != 0 {
						t.Fatalf("migrate up through the pooler: exit %d\n%s", r.code, r.out)
					}
				} else {
					if r.code == 0 || !strings.Contains(r.out, "pooler") || !strings.Contains(r.out, "--db-schema") {
						t.Fatalf("stock pooler with search_path in the URL: exit %d, want a refusal naming the pooler and --db-schema:\n%s", r.code, r.out)
					}
					env = baseEnv("DATABASE_URL="+via, "PELGUARD_DB_SCHEMA="+schema)
					if r := runBin(t, "consumer", env, 2*time.Minute, "migrate", "up"); r.code != 0 {
						t.Fatalf("migrate up through the stock pooler, URL without search_path: exit %d\n%s", r.code, r.out)
					}
				}
				got := testenv.Snapshot(t, pool, schema)
				for _, tbl := range migrations.Tables {
					if !strings.Contains(got, schema+"."+tbl+":") {
						t.Fatalf("%s.%s missing after migrate up through the pooler:\n%s", schema, tbl, got)
					}
				}
				if now := testenv.Snapshot(t, pool, "public"); now != team {
					t.Fatalf("migrate up through the pooler changed public:\nbefore:\n%s\nafter:\n%s", team, now)
				}
				if r := runBin(t, "consumer", env, time.Minute, "migrate", "status"); r.code != 0 || strings.Contains(r.out, "pending") {
					t.Fatalf("migrate status after up: exit %d\n%s", r.code, r.out)
				}
			}
		})
	}
}

// Through PgBouncer, repeated auditor runs, refund runs and usage runs
// leave no lock held by an idle server connection, so a later run straight
// to Postgres does not wait; and after a SIGKILLed run, the next one takes
// its lease over once it expires.
func TestAuditorLocksThroughPgBouncer(t *testing.T) {
	for _, p := range poolers {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			b := pgbouncer.Start(t, p.cfg)
			// A database of its own: pg_locks of the shared one holds other
			// tests' locks.
			pool, dbURL := testenv.FreshDatabase(t)
			schema := migrations.DefaultSchema
			db := dbName(t, dbURL)
			if r := runBin(t, "consumer", baseEnv("DATABASE_URL="+dbURL), 2*time.Minute, "migrate", "up"); r.code != 0 {
				t.Fatalf("migrate up: exit %d\n%s", r.code, r.out)
			}
			sim := stripesim.MustNew(stripesim.Config{})
			t.Cleanup(sim.Close)
			for i := range 3 {
				sim.SeedCharge(stripesim.ChargeSeed{Customer: fmt.Sprintf("cus_%d", i), Amount: 2500, Created: time.Now().Add(-3 * time.Hour)})
			}
			via := inDatabase(t, b.URL(""), db)
			env := baseEnv("DATABASE_URL="+via, "PELGUARD_DB_SCHEMA="+schema, "STRIPE_API_KEY="+testKey, "STRIPE_API_BASE="+sim.URL())
			for i := range 3 {
				for _, args := range [][]string{
					{"run", "--settle-delay", "0", "--lock-wait", "0"},
					{"refund", "--all", "--lock-wait", "0"},
					{"usage", "--lock-wait", "0"},
				} {
					if r := runBin(t, "auditor", env, 2*time.Minute, args...); r.code != 0 && r.code != 1 {
						t.Fatalf("auditor %v through the pooler (%d): exit %d\n%s", args, i, r.code, r.out)
					}
				}
				if n := idleAdvisoryLocks(t, pool, db); n != 0 {
					t.Fatalf("after %d rounds of auditor runs through the pooler, %d advisory locks are held by idle backends", i+1, n)
				}
			}
			direct := baseEnv("DATABASE_URL="+dbURL, "STRIPE_API_KEY="+testKey, "STRIPE_API_BASE="+sim.URL())
			if r := runBin(t, "auditor", direct, 2*time.Minute, "run", "--settle-delay", "0", "--lock-wait", "0"); r.code != 0 && r.code != 1 {
				t.Fatalf("a run straight to Postgres after the pooled runs: exit %d\n%s", r.code, r.out)
			}

			// SIGKILL a run while it holds its lease (Stripe answers slowly:
			// the run is still listing).
			if err := sim.SetFaults(stripesim.Faults{Latency: stripesim.Latency{Fixed: 5 * time.Second}}); err != nil {
				t.Fatal(err)
			}
			var epoch int64
			readLease := func() (owner string) {
				_ = pool.QueryRow(context.Background(), `SELECT coalesce(owner, ''), epoch FROM `+schema+`.run_leases WHERE name = 'audit_run'`).Scan(&owner, &epoch)
				return owner
			}
			victim := startBin(t, "auditor", env, "run", "--settle-delay", "0", "--from", time.Now().Add(-30*24*time.Hour).Format(time.RFC3339), "--lock-lease", "3s")
			testenv.Eventually(t, time.Minute, func() bool { return readLease() != "" }, "the run holds its lease")
			held := epoch
			if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			<-victim.done
			victim.done <- nil
			if readLease() == "" {
				t.Fatal("the killed run's lease was released: nothing left to expire")
			}
			if err := sim.SetFaults(stripesim.Faults{}); err != nil {
				t.Fatal(err)
			}
			r := runBin(t, "auditor", env, 2*time.Minute, "run", "--settle-delay", "0", "--lock-wait", "1m")
			if r.code != 0 && r.code != 1 {
				t.Fatalf("the run after a SIGKILLed one: exit %d\n%s", r.code, r.out)
			}
			if owner := readLease(); owner != "" || epoch != held+1 {
				t.Fatalf("after the next run: owner %q epoch %d, want free at epoch %d (taken over from the killed run)", owner, epoch, held+1)
			}
			if n := idleAdvisoryLocks(t, pool, db); n != 0 {
				t.Fatalf("%d advisory locks held by idle backends at the end", n)
			}
		})
	}
}

// Through PgBouncer, in either configuration, the consumer bills every
// event exactly once and the reaper, run over the stream afterwards, bills
// nothing more.
func TestBillingExactlyOnceThroughPgBouncer(t *testing.T) {
	const n = 200
	for _, p := range poolers {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			b := pgbouncer.Start(t, p.cfg)
			pool, dbURL := testenv.DBWithURL(t)
			schema := testenv.SchemaOfURL(dbURL)
			sim := stripesim.MustNew(stripesim.Config{})
			t.Cleanup(sim.Close)
			rdb := testenv.Redis(t)
			stream := testenv.Name(t, "billing")
			testenv.CleanupKeys(t, rdb, stream, stream+":dead")
			ctx := context.Background()
			for i := range n {
				ev := event.Event{CustomerID: fmt.Sprintf("c_%d", i), StripeCustomerID: fmt.Sprintf("cus_%d", i),
					AmountCents: 1000 + int64(i), Currency: "usd", BillingPeriod: "2026-11"}
				if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"payload": ev.Payload()}}).Err(); err != nil {
					t.Fatal(err)
				}
			}
			env := baseEnv("DATABASE_URL="+inDatabase(t, b.URL(""), dbName(t, dbURL)), "PELGUARD_DB_SCHEMA="+schema,
				"REDIS_URL="+testenv.RedisURL(), "STRIPE_API_KEY="+testKey, "STRIPE_API_BASE="+sim.URL())
			cons := startBin(t, "consumer", env, "--stream", stream, "--group", "g", "--metrics-addr", "", "--block", "100ms")
			charged := func() (c int) {
				_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.billing_records WHERE status = 'charged'`).Scan(&c)
				return c
			}
			testenv.Eventually(t, 2*time.Minute, func() bool { return charged() == n }, "%d events charged through the pooler", n)
			out := cons.stop()
			if strings.Contains(out, "prepared statement") {
				t.Fatalf("the consumer hit prepared statements through the pooler:\n%s", out)
			}
			if r := runBin(t, "reaper", env, 2*time.Minute, "--once", "--metrics-addr", "", "--stream", stream, "--group", "g", "--min-idle", "1s"); r.code != 0 {
				t.Fatalf("reaper --once through the pooler: exit %d\n%s", r.code, r.out)
			}
			perCustomer := map[string]int{}
			for _, c := range sim.Charges() {
				perCustomer[c.Customer]++
			}
			if len(perCustomer) != n || charged() != n {
				t.Fatalf("%d customers charged at Stripe, %d ledger rows charged; want %d each", len(perCustomer), charged(), n)
			}
			for cust, k := range perCustomer {
				if k != 1 {
					t.Fatalf("%s charged %d times through the pooler", cust, k)
				}
			}
		})
	}
}
