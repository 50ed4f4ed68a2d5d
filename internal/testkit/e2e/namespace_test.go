package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// nsWorld is a namespace test's environment: a migrated schema, a stream
// and its group, the emulator with a meter.
type nsWorld struct {
	pool   *pgxpool.Pool
	schema string
	rdb    *redis.Client
	stream string
	group  string
	sim    *stripesim.Server
	env    []string
}

func newNSWorld(t *testing.T, prefix string) *nsWorld {
	t.Helper()
	pool, dbURL := testenv.DBWithURL(t)
	w := &nsWorld{pool: pool, schema: testenv.SchemaOf(pool), rdb: testenv.Redis(t), stream: testenv.Name(t, prefix), group: "billing-group"}
	testenv.CleanupKeys(t, w.rdb, w.stream, w.stream+":dead")
	w.sim = stripesim.MustNew(stripesim.Config{})
	t.Cleanup(w.sim.Close)
	if _, err := w.sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: "api_requests"}); err != nil {
		t.Fatal(err)
	}
	w.env = baseEnv("REDIS_URL="+testenv.RedisURL(), "DATABASE_URL="+dbURL, "STRIPE_API_KEY="+testKey, "STRIPE_API_BASE="+w.sim.URL())
	return w
}

func (w *nsWorld) add(t *testing.T, payload string) {
	t.Helper()
	if err := w.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: w.stream, Values: map[string]any{"payload": payload}}).Err(); err != nil {
		t.Fatal(err)
	}
}

// backInThePEL puts a payload the fleet already handled back in the
// group's pending list, owned by a consumer that is gone: what an AOF
// rollback (or a re-publication read by a crashed consumer) leaves.
func (w *nsWorld) backInThePEL(t *testing.T, payload string) {
	t.Helper()
	ctx := context.Background()
	w.add(t, payload)
	if err := w.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: w.group, Consumer: "gone-1", Streams: []string{w.stream, ">"}, Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // past the reaper's --min-idle of 200ms
}

func (w *nsWorld) pending(t *testing.T) int64 {
	t.Helper()
	p, err := w.rdb.XPending(context.Background(), w.stream, w.group).Result()
	if err != nil {
		t.Fatal(err)
	}
	return p.Count
}

func (w *nsWorld) count(t *testing.T, q string) int {
	t.Helper()
	var n int
	if err := w.pool.QueryRow(context.Background(), strings.ReplaceAll(q, "{schema}", w.schema)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// refused asserts a role exited 2 naming both namespaces and the fix.
func refused(t *testing.T, what string, r result, recorded, given string) {
	t.Helper()
	if r.code != 2 || !strings.Contains(r.out, fmt.Sprintf("namespace %q", recorded)) ||
		!strings.Contains(r.out, fmt.Sprintf("--namespace %q", given)) || !strings.Contains(r.out, "pelguard-consumer namespace set") {
		t.Fatalf("%s: exit %d, want 2 naming namespaces %q and %q and the fix:\n%s", what, r.code, recorded, given, r.out)
	}
}

func consoleArgs(streamFlag, stream string) []string {
	return []string{"serve", streamFlag, stream, "--proxy-user-header", "X-User", "--trusted-proxy", "127.0.0.1",
		"--listen", "127.0.0.1:0", "--wait-for-deps", "10s"}
}

// Meter consumers run with --namespace prod. A reaper started without the
// flag finds a delivered event's entry back in the PEL: it refuses to start
// (exit 2, both namespaces and the fix named) instead of computing another
// identifier, finding "no row" and sending the event again. So does the
// console (its PEL page would say "no row → claim"). With the stream's
// namespace the reaper acks the entry: Stripe counts each event once.
func TestNamespaceIsAFactOfTheMeterStream(t *testing.T) {
	t.Parallel()
	w := newNSWorld(t, "usage")
	now := time.Now().UTC().Truncate(time.Second)
	var payloads []string
	for i := range 5 {
		e := event.MeterEvent{EventName: "api_requests", StripeCustomerID: fmt.Sprintf("cus_%d", i), Value: 2,
			Timestamp: now.Add(-time.Duration(i) * time.Minute)}
		if i%2 == 0 {
			e.EventID = fmt.Sprintf("req-%d", i) // checked through its stream entry
		}
		payloads = append(payloads, e.Payload())
		w.add(t, e.Payload())
	}
	c := startBin(t, "consumer", w.env, "meter-events", "--stream", w.stream, "--namespace", "prod", "--metrics-addr", "", "--block", "100ms")
	testenv.Eventually(t, 30*time.Second, func() bool { return w.sim.MeterEventCounts().Recorded == 5 && w.pending(t) == 0 }, "5 meter events sent")
	c.stop()
	w.backInThePEL(t, payloads[0])

	r := runBin(t, "reaper", w.env, time.Minute, "run", "--once", "--meter-stream", w.stream, "--min-idle", "200ms", "--metrics-addr", "")
	refused(t, "reaper without --namespace", r, "prod", "pelguard")
	r = runBin(t, "console", w.env, time.Minute, consoleArgs("--meter-stream", w.stream)...)
	refused(t, "console without --namespace", r, "prod", "pelguard")
	if n := w.sim.MeterEventCounts().Recorded; n != 5 || w.pending(t) != 1 {
		t.Fatalf("after the refusals: %d meter events at Stripe, %d pending; want 5 and 1", n, w.pending(t))
	}

	r = runBin(t, "reaper", w.env, time.Minute, "run", "--once", "--meter-stream", w.stream, "--min-idle", "200ms", "--metrics-addr", "", "--namespace", "prod")
	if r.code != 0 {
		t.Fatalf("reaper with the stream's namespace: exit %d\n%s", r.code, r.out)
	}
	if n, d := w.sim.MeterEventCounts().Recorded, w.count(t, `SELECT count(*) FROM {schema}.meter_events WHERE status = 'delivered'`); n != 5 || d != 5 || w.pending(t) != 0 {
		t.Fatalf("%d meter events at Stripe, %d delivered rows, %d pending; want 5, 5, 0", n, d, w.pending(t))
	}
}

// The same for charges: consumers with --namespace prod; a reaper, the
// console and an import without it refuse to start, and nothing is
// charged again or dead-lettered conflicting_event. An upgraded ledger
// (rows, no record yet) is checked before a namespace is recorded; `namespace
// set` changes it, recorded with who and why.
func TestNamespaceIsAFactOfTheChargeStream(t *testing.T) {
	t.Parallel()
	w := newNSWorld(t, "charges")
	var payloads []string
	for i := range 4 {
		e := event.Event{CustomerID: fmt.Sprintf("c_%d", i), StripeCustomerID: fmt.Sprintf("cus_%d", i), AmountCents: 119,
			BillingPeriod: "2026-11", Currency: "usd"}
		payloads = append(payloads, e.Payload())
		w.add(t, e.Payload())
	}
	c := startBin(t, "consumer", w.env, "run", "--stream", w.stream, "--namespace", "prod", "--metrics-addr", "", "--block", "100ms")
	testenv.Eventually(t, 30*time.Second, func() bool { return w.sim.ChargeCreates() == 4 && w.pending(t) == 0 }, "4 charges")
	c.stop()
	w.backInThePEL(t, payloads[1])

	reap := func(extra ...string) result {
		return runBin(t, "reaper", w.env, time.Minute, append([]string{"run", "--once", "--stream", w.stream, "--min-idle", "200ms", "--metrics-addr", "", "--stopped-consumers", "gone-1"}, extra...)...)
	}
	refused(t, "reaper without --namespace", reap(), "prod", "pelguard")
	refused(t, "console without --namespace", runBin(t, "console", w.env, time.Minute, consoleArgs("--stream", w.stream)...), "prod", "pelguard")
	refused(t, "import without --namespace", runBin(t, "consumer", w.env, time.Minute, "import", "--from-stripe", "--period", "2026-11", "--dry-run"), "prod", "pelguard")
	if n, dead := w.sim.ChargeCreates(), w.count(t, `SELECT count(*) FROM {schema}.billing_records WHERE status = 'charged'`); n != 4 || dead != 4 || w.pending(t) != 1 {
		t.Fatalf("after the refusals: %d charges, %d charged rows, %d pending; want 4, 4, 1", n, dead, w.pending(t))
	}
	if n, _ := w.rdb.XLen(context.Background(), w.stream+":dead").Result(); n != 0 {
		t.Fatalf("%d dead letters", n)
	}

	// An upgrade: the ledger has rows, the stream no record. A role with
	// another namespace than the rows' is refused before it records one.
	if _, err := w.pool.Exec(context.Background(), `DELETE FROM `+w.schema+`.stream_namespaces`); err != nil {
		t.Fatal(err)
	}
	r := reap()
	if r.code != 2 || !strings.Contains(r.out, "no recorded namespace") || !strings.Contains(r.out, `--namespace "pelguard"`) {
		t.Fatalf("reaper on an upgraded ledger without --namespace: exit %d\n%s", r.code, r.out)
	}
	if n := w.count(t, `SELECT count(*) FROM {schema}.stream_namespaces`); n != 0 {
		t.Fatalf("the refused reaper recorded a namespace (%d rows)", n)
	}
	if r := reap("--namespace", "prod"); r.code != 0 {
		t.Fatalf("reaper with the rows' namespace: exit %d\n%s", r.code, r.out)
	}
	if n := w.sim.ChargeCreates(); n != 4 || w.pending(t) != 0 {
		t.Fatalf("%d charges, %d pending; want 4 and 0", n, w.pending(t))
	}
	show := runBin(t, "consumer", w.env, time.Minute, "namespace", "show")
	if show.code != 0 || !strings.Contains(show.out, w.stream) || !strings.Contains(show.out, "prod") {
		t.Fatalf("namespace show: exit %d\n%s", show.code, show.out)
	}

	set := runBin(t, "consumer", w.env, time.Minute, "namespace", "set", "--stream", w.stream, "--group", w.group,
		"--namespace", "staging", "--reason", "environment renamed", "--by", "ops@example")
	if set.code != 0 {
		t.Fatalf("namespace set: exit %d\n%s", set.code, set.out)
	}
	if n := w.count(t, `SELECT count(*) FROM {schema}.stream_fact_changes WHERE fact = 'namespace' AND old_value = 'prod'
		AND new_value = 'staging' AND actor = 'ops@example' AND reason = 'environment renamed'`); n != 1 {
		t.Fatalf("%d change rows for the set", n)
	}
	refused(t, "reaper with the old namespace", reap("--namespace", "prod"), "staging", "prod")
}
