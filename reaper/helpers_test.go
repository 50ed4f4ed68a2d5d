package reaper_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/reaper"
	"github.com/pelguard/pelguard/stripeapi"
)

const (
	testKey       = "sk_test_pelguard_reaper"
	testNamespace = "test"
	deadName      = "dead-consumer" // reads entries and never processes them: a killed process
)

// bundle is one test's world: its own stream and group on the real Redis,
// its own schema on the real Postgres, its own Stripe emulator.
type bundle struct {
	rdb      *redis.Client
	pool     *pgxpool.Pool
	ledger   *ledger.Ledger
	clk      *clock.Sim
	sim      *stripesim.Server
	stripe   *stripeapi.Client
	notifier *alerts.Memory
	stream   string
	group    string

	mu        sync.Mutex
	decisions []reaper.Decision
}

func setup(t testing.TB) *bundle {
	t.Helper()
	pool := testenv.DB(t)
	sim, err := stripesim.New(stripesim.Config{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	sc, err := stripeapi.New(stripeapi.Config{APIKey: testKey, BaseURL: sim.URL(), MaxNetworkRetries: -1, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// A clock that follows the wall clock (real timeouts still fire) and can
	// be pushed forward to expire leases without sleeping.
	clk := clock.NewSimFollowing()
	b := &bundle{
		rdb: testenv.Redis(t), pool: pool, ledger: ledger.New(pool, testenv.SchemaOf(pool), clk), clk: clk,
		sim: sim, stripe: sc, notifier: alerts.NewMemory(),
		stream: testenv.Name(t, "billing"), group: "billing-group",
	}
	testenv.CleanupKeys(t, b.rdb, b.stream, consumer.DeadLetterStream(b.stream))
	if err := consumer.EnsureGroup(context.Background(), b.rdb, b.stream, b.group); err != nil {
		t.Fatal(err)
	}
	return b
}

// config is a reaper configuration for the bundle; MinIdle is tiny so that
// tests only wait for Redis to report the entries idle (waitIdle).
func (b *bundle) config(t testing.TB, name string) reaper.Config {
	return reaper.Config{
		Redis: b.rdb, DB: b.pool, Schema: testenv.SchemaOf(b.pool), Stripe: b.stripe,
		Streams: []reaper.StreamGroup{{Stream: b.stream, Group: b.group}},
		Name:    name, MinIdle: time.Millisecond, Interval: 50 * time.Millisecond,
		Namespace: testNamespace, Lease: 3 * time.Second, Workers: 8, PageSize: 100,
		Notifier: b.notifier, Logger: testenv.Logger(t), Clock: b.clk,
		OnDecision: b.onDecision,
	}
}

func (b *bundle) newReaper(t testing.TB, cfg reaper.Config) *reaper.Reaper {
	t.Helper()
	r, err := reaper.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (b *bundle) onDecision(d reaper.Decision) {
	b.mu.Lock()
	b.decisions = append(b.decisions, d)
	b.mu.Unlock()
}

func (b *bundle) kinds() map[reaper.Kind]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[reaper.Kind]int{}
	for _, d := range b.decisions {
		out[d.Kind]++
	}
	return out
}

func ev(i int) event.Event {
	return event.Event{CustomerID: fmt.Sprintf("c_%d", i), StripeCustomerID: fmt.Sprintf("cus_%d", i),
		AmountCents: int64(1000 + i), BillingPeriod: "2026-11", Currency: "usd"}
}

// add puts events on the stream and returns their ids.
func (b *bundle) add(t testing.TB, evs ...event.Event) []string {
	t.Helper()
	pipe := b.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(evs))
	for i, e := range evs {
		cmds[i] = pipe.XAdd(context.Background(), &redis.XAddArgs{Stream: b.stream, Values: map[string]any{"payload": e.Payload()}})
	}
	if _, err := pipe.Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(cmds))
	for i, c := range cmds {
		ids[i] = c.Val()
	}
	return ids
}

// read delivers up to n new entries to consumer name, as XREADGROUP does
// for a pelguard consumer (registered, see consumer.Register) that then
// dies.
func (b *bundle) read(t testing.TB, name string, n int64) []redis.XMessage {
	t.Helper()
	if err := consumer.Register(context.Background(), b.rdb, b.stream, b.group, name, b.clk.Now()); err != nil {
		t.Fatal(err)
	}
	testenv.CleanupKeys(t, b.rdb, consumer.LivenessKey(b.stream, b.group))
	res, err := b.rdb.XReadGroup(context.Background(), &redis.XReadGroupArgs{Group: b.group, Consumer: name,
		Streams: []string{b.stream, ">"}, Count: n, Block: -1}).Result()
	if err != nil {
		t.Fatal(err)
	}
	return res[0].Messages
}

// pending is the whole PEL, in id order.
func (b *bundle) pending(t testing.TB) []redis.XPendingExt {
	t.Helper()
	p, err := b.rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{
		Stream: b.stream, Group: b.group, Start: "-", End: "+", Count: 1_000_000}).Result()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitIdle waits until Redis reports n entries idle at least d: the reaper
// only looks at those. A wait on the real server, not a sleep.
func (b *bundle) waitIdle(t testing.TB, n int, d time.Duration) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() bool {
		p, err := b.rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{
			Stream: b.stream, Group: b.group, Idle: d, Start: "-", End: "+", Count: int64(n) + 1}).Result()
		return err == nil && len(p) >= n
	}, "%d entries idle %s", n, d)
}

// reserve gives owner a pending ledger row for e with a lease.
func (b *bundle) reserve(t testing.TB, e event.Event, owner string, lease time.Duration) ledger.Record {
	t.Helper()
	c, err := b.ledger.Reserve(context.Background(), ledger.ReserveRequest{
		Event: e, IdempotencyKey: e.Key(testNamespace), Owner: owner, Lease: lease, MessageID: "0-0"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Decision != ledger.Acquired {
		t.Fatalf("reserve %s: %s", ledger.EventKey(e), c.Decision)
	}
	return c.Record
}

// charge makes a real charge at the emulator and records it in the ledger,
// as a consumer that then died before XACK would have.
func (b *bundle) charge(t testing.TB, e event.Event) ledger.Record {
	t.Helper()
	rec := b.reserve(t, e, deadName, time.Minute)
	ch, err := b.stripe.Charge(context.Background(), stripeapi.ChargeRequest{
		IdempotencyKey: rec.IdempotencyKey, StripeCustomerID: e.StripeCustomerID, AmountCents: e.AmountCents,
		Currency: e.Currency, Description: "Usage billing for " + e.BillingPeriod,
		Metadata: stripeapi.PelguardMetadata(e.CustomerID, e.BillingPeriod, rec.IdempotencyKey)})
	if err != nil {
		t.Fatal(err)
	}
	rec, err = b.ledger.Finish(context.Background(), rec, ledger.Outcome{Status: ledger.StatusCharged, ChargeID: ch.ID})
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func (b *bundle) get(t testing.TB, e event.Event) (ledger.Record, bool) {
	t.Helper()
	recs, err := b.ledger.Lookup(context.Background(), []ledger.Key{ledger.EventKey(e)})
	if err != nil {
		t.Fatal(err)
	}
	r, ok := recs[ledger.EventKey(e)]
	return r, ok
}

// snapshotLedger is every billing record as text, for "nothing changed".
func (b *bundle) snapshotLedger(t testing.TB) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(),
		`SELECT row_to_json(b)::text FROM billing_records b ORDER BY customer_id, billing_period`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (b *bundle) deadLetters(t testing.TB) []redis.XMessage {
	t.Helper()
	msgs, err := b.rdb.XRange(context.Background(), consumer.DeadLetterStream(b.stream), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}
