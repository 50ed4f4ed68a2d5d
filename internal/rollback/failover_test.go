package rollback_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/repair"
	"github.com/pelguard/pelguard/internal/rollback"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/pgbouncer"
	"github.com/pelguard/pelguard/internal/testkit/pgfailover"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/migrations"
	"github.com/pelguard/pelguard/reaper"
	"github.com/pelguard/pelguard/stripeapi"
)

// A real primary and asynchronous replica: consumers bill, the replica's
// stream stalls, the consumers bill more (committed, acked, never
// replicated), the primary dies and the replica is promoted. With no
// command run, the fleet must notice, fence, repair the ledger from Stripe
// and bill on; and the lost events coming back a day later, under keys
// Stripe has forgotten, must charge nobody twice.
func TestBillingThroughAFailoverThatLosesCommits(t *testing.T) {
	t.Parallel()
	failoverDrill(t, drillOpts{})
}

// The same, with Redis rolled back at the same moment (its AOF lost the
// last second): the acks and the witness mirror of the lost commits are
// gone too, the entries are delivered again, and the live processes'
// memory is the witness.
func TestBillingThroughAFailoverWithRedisRolledBackToo(t *testing.T) {
	t.Parallel()
	failoverDrill(t, drillOpts{redisRollsBack: true})
}

// The same behind PgBouncer in transaction mode, re-pointed at the promoted
// replica after the failover as a team does: the fleet's connections to the
// pooler survive it, so pgx's check on each new connection does not run for
// them; the server identity in each outcome's witness bump makes the check
// run on the new primary before any outcome commits there. Every event is
// charged once at the emulator and the ledger is repaired to equal it.
func TestBillingThroughAFailoverBehindPgBouncer(t *testing.T) {
	t.Parallel()
	failoverDrill(t, drillOpts{pooler: true})
}

// drillOpts vary the failover drill.
type drillOpts struct {
	// redisRollsBack: Redis loses the last second at the failover too.
	redisRollsBack bool
	// pooler puts PgBouncer (transaction mode) between the fleet and the
	// primary, re-pointed at the promoted replica after the failover
	// (TestBillingThroughAFailoverBehindPgBouncer).
	pooler bool
}

const (
	drillBefore = 30 // billed and replicated before the stall
	drillLost   = 30 // billed while the replica is stalled: lost by the failover
	drillAfter  = 20 // billed after the failover
	drillKey    = "sk_test_pelguard_failover"
)

func drillEvent(i int) event.Event {
	return event.Event{CustomerID: fmt.Sprintf("c_%03d", i), StripeCustomerID: fmt.Sprintf("cus_%03d", i),
		AmountCents: int64(1000 + i), BillingPeriod: "2026-11", Currency: "usd"}
}

type drillProc struct {
	mon  *rollback.Monitor
	pool *pgxpool.Pool
}

func failoverDrill(t *testing.T, o drillOpts) {
	failoverSlot(t)
	cl := pgfailover.Start(t, pgfailover.Options{})
	redisRollsBack := o.redisRollsBack
	// The fleet's way in: the cluster's VIP, or the pooler in front of the
	// primary, whose client connections outlive the failover.
	clientURL, repoint := cl.URL(), func() {}
	if o.pooler {
		b := pgbouncer.Start(t, pgbouncer.Config{Server: cl.Primary().URL()})
		clientURL, repoint = b.URL(""), func() { b.Repoint(t, cl.Primary().Addr()) }
	}
	// As every role opens its pool: pgx's cache_describe mode (cache_statement
	// fails through a transaction-mode pooler), the check on each new
	// connection.
	poolConfig := func() *pgxpool.Config {
		t.Helper()
		cfg, err := pgxpool.ParseConfig(clientURL)
		if err != nil {
			t.Fatal(err)
		}
		pg.PoolerSafe(cfg)
		return cfg
	}
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	const schema = "pelguard"
	t0 := time.Now().UTC().Truncate(time.Second)
	clk := clock.NewSim(t0)
	sim, err := stripesim.New(stripesim.Config{Now: t0, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	sc, err := stripeapi.New(stripeapi.Config{APIKey: drillKey, BaseURL: sim.URL(), MaxNetworkRetries: -1, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	rdb := testenv.Redis(t)
	stream := testenv.Name(t, "failover")
	testenv.CleanupKeys(t, rdb, stream, consumer.DeadLetterStream(stream))
	if err := consumer.EnsureGroup(ctx, rdb, stream, "billing"); err != nil {
		t.Fatal(err)
	}
	{
		admin, err := pgxpool.NewWithConfig(ctx, poolConfig())
		if err != nil {
			t.Fatal(err)
		}
		m, err := migrations.New(admin, schema, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Up(ctx); err != nil {
			t.Fatal(err)
		}
		_ = m.Close()
		admin.Close()
	}
	if err := cl.WaitReplicaCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	notes := alerts.NewMemory()
	var repairs atomic.Int32

	// Behind the pooler the periodic check runs every 2 s (production: 1 s),
	// so that the writes reaching the promoted primary through connections
	// that outlived the failover meet the server fence before the next
	// periodic check does (the drill logs how many did).
	every := 200 * time.Millisecond
	if o.pooler {
		every = 2 * time.Second
	}
	start := func(name string, reap bool) drillProc {
		t.Helper()
		role := map[bool]string{false: "consumer/", true: "reaper/"}[reap]
		mon, err := rollback.New(rollback.Config{Schema: schema, Writer: role + name, Redis: rdb, Notifier: notes,
			Logger: testenv.Logger(t), Clock: clk, Every: every})
		if err != nil {
			t.Fatal(err)
		}
		cfg := poolConfig()
		cfg.MaxConns, cfg.AfterConnect = 8, mon.AfterConnect
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		l := ledger.New(pool, schema, clk)
		mon.SetRepair(func(ctx context.Context, since time.Time) (rollback.RepairReport, error) {
			repairs.Add(1)
			rep, err := repair.Run(ctx, repair.Config{Ledger: l, Stripe: sc, Since: since, Namespace: "drill", By: role + name})
			return rollback.RepairReport{Rebuilt: rep.Rebuilt, Repaired: rep.Repaired, RefundsRebuilt: rep.RefundsRebuilt,
				Findings: rep.Findings}, err
		})
		if err := mon.Start(ctx, pool); err != nil {
			t.Fatal(err)
		}
		var stop func(context.Context) error
		if reap {
			r, err := reaper.New(reaper.Config{Redis: rdb, DB: pool, Schema: schema, Stripe: sc, Name: name,
				Streams: []reaper.StreamGroup{{Stream: stream, Group: "billing"}}, Namespace: "drill",
				MinIdle: 3 * time.Second, Interval: 500 * time.Millisecond, Lease: 5 * time.Second,
				Logger: testenv.Logger(t), Clock: clk, Witness: mon})
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Start(ctx); err != nil {
				t.Fatal(err)
			}
			stop = r.Stop
		} else {
			c, err := consumer.New(consumer.Config{Redis: rdb, DB: pool, Schema: schema, Stripe: sc, Stream: stream, Group: "billing",
				Name: name, Namespace: "drill", Block: 50 * time.Millisecond, Lease: 5 * time.Second, Workers: 4,
				Logger: testenv.Logger(t), Clock: clk, Witness: mon, FollowUpEvery: -1})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
			stop = c.Stop
		}
		t.Cleanup(func() {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = stop(sctx)
			mon.Close()
			pool.Close()
		})
		return drillProc{mon: mon, pool: pool}
	}
	procs := []drillProc{start("a", false), start("b", false), start("r", true)}

	publish := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"payload": drillEvent(i).Payload()}}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	charged := func(from, to int) int {
		n := 0
		for i := from; i < to; i++ {
			n += sim.SucceededCharges(drillEvent(i).CustomerID, "2026-11")
		}
		return n
	}
	acked := func() bool {
		p, err := rdb.XPending(ctx, stream, "billing").Result()
		if err != nil {
			return false
		}
		info, err := rdb.XInfoGroups(ctx, stream).Result()
		return err == nil && p.Count == 0 && len(info) == 1 && info[0].Lag == 0
	}

	// Before: billed and replicated.
	publish(0, drillBefore)
	testenv.Eventually(t, 60*time.Second, func() bool { return charged(0, drillBefore) == drillBefore && acked() },
		"the first %d events were not billed", drillBefore)
	if err := cl.WaitReplicaCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}

	// The stall: billed, acked, and never replicated. With Redis rolling
	// back too, its state from before these entries were read is kept to
	// be put back at the failover (the entries added, the group not yet
	// past them, the witness mirror without these commits).
	if err := cl.StallReplication(ctx); err != nil {
		t.Fatal(err)
	}
	var dumps map[string]string
	if redisRollsBack {
		dumps = dumpKeys(t, ctx, rdb, func(pipe redis.Pipeliner) {
			for i := drillBefore; i < drillBefore+drillLost; i++ {
				pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"payload": drillEvent(i).Payload()}})
			}
		}, stream, witnessKey(t, ctx, procs[0].pool, schema))
	} else {
		publish(drillBefore, drillBefore+drillLost)
	}
	testenv.Eventually(t, 60*time.Second, func() bool { return charged(0, drillBefore+drillLost) == drillBefore+drillLost && acked() },
		"the events billed during the stall were not billed")

	connsBefore := newConns(procs)
	loss, err := cl.FailoverLosingCommits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	detectedFrom := time.Now()
	repoint()
	if redisRollsBack {
		restoreKeys(t, ctx, rdb, dumps)
	}
	var lostRows int
	{
		conn, err := pgxpool.New(ctx, cl.Primary().URL())
		if err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, `SELECT $1::int - count(*) FROM pelguard.billing_records WHERE status = 'charged'`,
			drillBefore+drillLost).Scan(&lostRows); err != nil {
			t.Fatal(err)
		}
		conn.Close()
	}
	t.Logf("failover: the replica was %d bytes behind; %d charged rows are gone from the ledger", loss.Bytes(), lostRows)
	if lostRows == 0 {
		t.Fatal("the failover lost no ledger rows: the drill proves nothing")
	}

	// Bill on through it, with no command run by hand.
	publish(drillBefore+drillLost, drillBefore+drillLost+drillAfter)
	total := drillBefore + drillLost + drillAfter
	var detected, repaired time.Duration
	testenv.Eventually(t, 90*time.Second, func() bool {
		if detected == 0 && procs[0].mon.Suspect() {
			detected = time.Since(detectedFrom)
		}
		if repaired == 0 && detected != 0 && !procs[0].mon.Suspect() && !procs[1].mon.Suspect() && !procs[2].mon.Suspect() {
			repaired = time.Since(detectedFrom)
		}
		return repaired != 0 && charged(0, total) >= total && acked() && ledgerCharged(t, ctx, procs[0].pool, schema) == total
	}, "billing did not resume with a ledger equal to Stripe (charged %d of %d, ledger %d)",
		charged(0, total), total, ledgerCharged(t, ctx, procs[0].pool, schema))
	var rechecks int64
	for _, p := range procs {
		rechecks += p.mon.Rechecks()
	}
	t.Logf("detected %v after the failover, repaired %v after it (%d repair runs); the fleet's pools opened %d connections across it; "+
		"%d writes met a server their monitor had not checked and waited for the check",
		detected.Round(time.Millisecond), repaired.Round(time.Millisecond), repairs.Load(), newConns(procs)-connsBefore, rechecks)

	assertLedgerEqualsStripe(t, ctx, procs[0].pool, schema, sim, total)
	if got := kinds(notes.Alerts()); got[alerts.KindLedgerRollback] != 1 || got[alerts.KindLedgerRepaired] != 1 {
		t.Fatalf("alerts %v: want the rollback announced once and its repair once", got)
	}

	// A day later the lost events come back (re-published: new entry ids,
	// no occurred_at), under keys Stripe has forgotten.
	clk.Advance(25 * time.Hour)
	sim.Advance(25 * time.Hour)
	publish(drillBefore, drillBefore+drillLost)
	testenv.Eventually(t, 60*time.Second, acked, "the re-published events were not acked")
	if got := charged(0, total); got != total {
		t.Fatalf("after the lost events came back a day later: %d charges for %d events (duplicates: %d)", got, total, got-total)
	}
	assertLedgerEqualsStripe(t, ctx, procs[0].pool, schema, sim, total)
}

// newConns is how many connections the processes' pools have opened.
func newConns(procs []drillProc) int64 {
	var n int64
	for _, p := range procs {
		n += p.pool.Stat().NewConnsCount()
	}
	return n
}

func ledgerCharged(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string) int {
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.billing_records WHERE status = 'charged'`).Scan(&n); err != nil {
		return -1
	}
	return n
}

// assertLedgerEqualsStripe: every event charged once at the emulator, its
// ledger row charged with that very charge, and no row left pending or
// processing.
func assertLedgerEqualsStripe(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string, sim *stripesim.Server, total int) {
	t.Helper()
	byCustomer := map[string][]string{}
	for _, ch := range sim.Charges() {
		if ch.Status == "succeeded" && ch.AmountRefunded == 0 {
			byCustomer[ch.Customer] = append(byCustomer[ch.Customer], ch.ID)
		}
	}
	rows, err := pool.Query(ctx, `SELECT stripe_customer_id, status, coalesce(charge_id, '') FROM `+schema+`.billing_records`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var cus, status, charge string
		if err := rows.Scan(&cus, &status, &charge); err != nil {
			t.Fatal(err)
		}
		n++
		if status != "charged" || len(byCustomer[cus]) != 1 || byCustomer[cus][0] != charge {
			t.Errorf("%s: ledger %s %q, Stripe %v", cus, status, charge, byCustomer[cus])
		}
	}
	if n != total || len(byCustomer) != total {
		t.Fatalf("ledger has %d rows and Stripe charged %d customers; want %d each", n, len(byCustomer), total)
	}
}

func witnessKey(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string) string {
	t.Helper()
	var id string
	if err := pool.QueryRow(ctx, `SELECT ledger_id FROM `+schema+`.ledger_fence`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return "pelguard:ledger-witness:" + id
}

// dumpKeys runs add and DUMPs keys in one MULTI: Redis's state at one
// instant, as an AOF rollback would bring it back.
func dumpKeys(t *testing.T, ctx context.Context, rdb *redis.Client, add func(redis.Pipeliner), keys ...string) map[string]string {
	t.Helper()
	var cmds []*redis.StringCmd
	if _, err := rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		add(pipe)
		for _, k := range keys {
			cmds = append(cmds, pipe.Dump(ctx, k))
		}
		return nil
	}); err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for i, k := range keys {
		v, err := cmds[i].Result()
		if err == redis.Nil {
			v = ""
		} else if err != nil {
			t.Fatal(err)
		}
		out[k] = v
	}
	return out
}

func restoreKeys(t *testing.T, ctx context.Context, rdb *redis.Client, dumps map[string]string) {
	t.Helper()
	for k, v := range dumps {
		if v == "" {
			if err := rdb.Del(ctx, k).Err(); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := rdb.RestoreReplace(ctx, k, 0, v).Err(); err != nil {
			t.Fatal(err)
		}
	}
}
