package fleet_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/reaper"
	"github.com/pelguard/pelguard/stripeapi"
	"github.com/pelguard/pelguard/stripelimit"
)

const (
	testKey   = "sk_test_pelguard_fleet"
	namespace = "fleet"
	deadName  = "dead" // a consumer that read entries and died: the reaper re-drives them
)

// world is one test's fleet environment: an emulator behind a Meter, a
// migrated schema, a stream and group, an account name of its own in Redis
// and an application_name that marks the fleet's Postgres connections.
type world struct {
	sim     *stripesim.Server
	meter   *stripesim.Meter
	url     string
	admin   *pgxpool.Pool
	dbURL   string
	schema  string
	rdb     *redis.Client
	stream  string
	group   string
	account string
	app     string

	mu    sync.Mutex
	stops []func()
}

func newWorld(t testing.TB, faults stripesim.Faults) *world {
	t.Helper()
	sim, err := stripesim.New(stripesim.Config{Seed: 1, Faults: faults})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	meter := stripesim.NewMeter(sim)
	srv := httptest.NewServer(meter)
	t.Cleanup(srv.Close)
	admin, url := testenv.DBWithURL(t)
	suffix := testenv.Suffix()
	w := &world{sim: sim, meter: meter, url: srv.URL, admin: admin, dbURL: url, schema: testenv.SchemaOf(admin),
		rdb: testenv.Redis(t), stream: testenv.Name(t, "billing"), group: "billing-group",
		account: "fleet-" + suffix, app: "pelguard-fleet-" + suffix}
	testenv.CleanupKeys(t, w.rdb, w.stream, consumer.DeadLetterStream(w.stream))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if keys, _ := w.rdb.Keys(ctx, stripelimit.KeyPrefix+"{"+w.account+"}*").Result(); len(keys) > 0 {
			_ = w.rdb.Del(ctx, keys...).Err()
		}
	})
	if err := consumer.EnsureGroup(context.Background(), w.rdb, w.stream, w.group); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.stopAll)
	return w
}

// limits says how a process paces Stripe: shared through Redis (rate is
// the account's) or today's process-local limit (rate per process).
type limits struct {
	local        bool
	rate         float64
	fallback     float64
	backoff      time.Duration
	limiterRedis redis.UniversalClient // nil: a client of its own on REDIS_URL
}

// proc is what one pelguard process owns.
type proc struct {
	pool    *pgxpool.Pool
	rdb     *redis.Client
	stripe  *stripeapi.Client
	limiter *stripelimit.Limiter
	scfg    stripeapi.Config
}

func (w *world) newProc(t testing.TB, role stripelimit.Role, conns int32, l limits) *proc {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(w.dbURL + "&application_name=" + w.app)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	opt, err := redis.ParseURL(testenv.RedisURL())
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	p := &proc{pool: pool, rdb: rdb}
	p.scfg = stripeapi.Config{APIKey: testKey, BaseURL: w.url, Mode: stripeapi.ModeCharges,
		MaxNetworkRetries: stripeapi.NoRetries, Timeout: 20 * time.Second}
	if l.local {
		p.scfg.RateLimit = l.rate
	} else if l.rate > 0 {
		lr := l.limiterRedis
		if lr == nil {
			lr = rdb
		}
		p.limiter, err = stripelimit.New(stripelimit.Config{Account: w.account, Role: role, Rate: l.rate, Redis: lr,
			FallbackRate: l.fallback, Backoff: l.backoff, RetryRedis: 200 * time.Millisecond, Logger: testenv.Discard()})
		if err != nil {
			t.Fatal(err)
		}
		p.scfg.Limiter = p.limiter
	}
	if p.stripe, err = stripeapi.New(p.scfg); err != nil {
		t.Fatal(err)
	}
	return p
}

func (w *world) onStop(f func()) {
	w.mu.Lock()
	w.stops = append(w.stops, f)
	w.mu.Unlock()
}

// stopAll stops every consumer and reaper started, newest first.
func (w *world) stopAll() {
	w.mu.Lock()
	stops := w.stops
	w.stops = nil
	w.mu.Unlock()
	for i := len(stops) - 1; i >= 0; i-- {
		stops[i]()
	}
}

func (w *world) startConsumer(t testing.TB, name string, workers int, p *proc) {
	t.Helper()
	c, err := consumer.New(consumer.Config{Redis: p.rdb, DB: p.pool, Schema: w.schema, Stripe: p.stripe,
		Stream: w.stream, Group: w.group, Name: name, Namespace: namespace, Workers: workers, Count: 20,
		Block: 100 * time.Millisecond, Lease: 3 * time.Second, Logger: testenv.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	w.onStop(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Stop(ctx)
	})
}

func (w *world) startReaper(t testing.TB, p *proc) {
	t.Helper()
	r, err := reaper.New(reaper.Config{Redis: p.rdb, DB: p.pool, Schema: w.schema, Stripe: p.stripe,
		Streams: []reaper.StreamGroup{{Stream: w.stream, Group: w.group}}, Name: "reaper",
		MinIdle: 2 * time.Second, Interval: 500 * time.Millisecond, Namespace: namespace, Lease: 3 * time.Second,
		Workers: 16, PageSize: 100, StoppedConsumers: []string{deadName}, Logger: testenv.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	w.onStop(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
}

// auditOnce runs one audit over the last hour with the process's Stripe
// settings (its limiter included).
func (w *world) auditOnce(t testing.TB, p *proc) (audit.Report, error) {
	t.Helper()
	a, err := audit.New(audit.Config{DB: p.pool, Schema: w.schema, Stripe: p.scfg, Logger: testenv.Discard(), LockWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	return a.Run(context.Background(), audit.Window{From: now.Add(-time.Hour), To: now.Add(time.Minute)})
}

func ev(i int) event.Event {
	return event.Event{CustomerID: fmt.Sprintf("c_%d", i), StripeCustomerID: fmt.Sprintf("cus_%d", i),
		AmountCents: int64(1000 + i%5000), BillingPeriod: "2026-11", Currency: "usd"}
}

// seed puts n events on the stream.
func (w *world) seed(t testing.TB, n int) {
	t.Helper()
	ctx := context.Background()
	for start := 0; start < n; start += 1000 {
		pipe := w.rdb.Pipeline()
		for i := start; i < min(n, start+1000); i++ {
			e := ev(i)
			payload := fmt.Sprintf(`{"customer_id":%q,"stripe_customer_id":%q,"amount_cents":%d,"billing_period":%q,"currency":"usd"}`,
				e.CustomerID, e.StripeCustomerID, e.AmountCents, e.BillingPeriod)
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: w.stream, Values: map[string]any{"payload": payload}})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// killOne reads n entries as a consumer that dies at once: they stay in
// its PEL for the reaper.
func (w *world) killOne(t testing.TB, n int64) {
	t.Helper()
	if n == 0 {
		return
	}
	if err := w.rdb.XReadGroup(context.Background(), &redis.XReadGroupArgs{Group: w.group, Consumer: deadName,
		Streams: []string{w.stream, ">"}, Count: n}).Err(); err != nil {
		t.Fatal(err)
	}
}

func (w *world) charged(t testing.TB) int {
	t.Helper()
	var n int
	if err := w.admin.QueryRow(context.Background(),
		"SELECT count(*) FROM "+w.schema+".billing_records WHERE status = 'charged'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (w *world) pending(t testing.TB) int64 {
	t.Helper()
	p, err := w.rdb.XPending(context.Background(), w.stream, w.group).Result()
	if err != nil {
		t.Fatal(err)
	}
	return p.Count
}

// pgSampler samples the fleet's Postgres connections (pg_stat_activity,
// by application_name) until stopped and keeps the most seen.
type pgSampler struct {
	most atomic.Int64
	stop func()
}

func (w *world) samplePG(t testing.TB) *pgSampler {
	s := &pgSampler{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	s.stop = func() { cancel(); <-done }
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			var n int64
			if err := w.admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", w.app).Scan(&n); err == nil {
				s.most.Store(max(s.most.Load(), n))
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// checkExactlyOnce asserts every one of n customers has exactly one
// succeeded charge at the emulator and a charged ledger row.
func (w *world) checkExactlyOnce(t testing.TB, n int) {
	t.Helper()
	if d := w.sim.Duplicates(); len(d) > 0 {
		t.Errorf("%d customers charged twice (first: %+v)", len(d), d[0])
	}
	per := map[string]int{}
	for _, c := range w.sim.Charges() {
		if c.Status == "succeeded" && !c.Refunded {
			per[c.Metadata["customer_id"]]++
		}
	}
	missing := 0
	for i := range n {
		if per[fmt.Sprintf("c_%d", i)] != 1 {
			missing++
		}
	}
	if missing > 0 {
		t.Errorf("%d of %d customers without exactly one charge", missing, n)
	}
	if got := w.charged(t); got != n {
		t.Errorf("ledger: %d charged rows, want %d", got, n)
	}
}

func env(name string, def int) int {
	var v int
	if _, err := fmt.Sscan(strings.TrimSpace(os.Getenv(name)), &v); err == nil && v > 0 {
		return v
	}
	return def
}
