package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

const testKey = "sk_test_pelguard_consumer"

// bundle is one test's world: its own stream and group on the real Redis,
// its own schema on the real Postgres, its own Stripe emulator.
type bundle struct {
	rdb    *redis.Client
	ledger *ledger.Ledger
	pool   *pgxpool.Pool
	clk    clock.Clock
	sim    *stripesim.Server
	stripe *stripeapi.Client
	stream string
	group  string
	dbURL  string
}

type opts struct {
	clk        clock.Clock
	simNow     time.Time
	noKeepAliv bool
	retries    int64
	webhook    stripesim.Webhook
	// onMeterCall: stripesim.Config.OnMeterEventInFlight.
	onMeterCall func(customer, eventName string)
}

func setup(t testing.TB, o opts) *bundle {
	t.Helper()
	pool, url := testenv.DBWithURL(t)
	sim, err := stripesim.New(stripesim.Config{Now: o.simNow, Seed: 1, Webhook: o.webhook, OnMeterEventInFlight: o.onMeterCall})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	var hc *http.Client
	if o.noKeepAliv {
		// A dropped connection on a fresh connection surfaces as an error;
		// on a reused one net/http would silently resend the POST.
		hc = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	}
	retries := o.retries
	if retries == 0 {
		retries = -1
	}
	sc, err := stripeapi.New(stripeapi.Config{APIKey: testKey, BaseURL: sim.URL(), MaxNetworkRetries: retries,
		Timeout: 10 * time.Second, HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{
		rdb:    testenv.Redis(t),
		ledger: ledger.New(pool, testenv.SchemaOf(pool), o.clk),
		pool:   pool,
		clk:    o.clk,
		sim:    sim,
		stripe: sc,
		stream: testenv.Name(t, "billing"),
		group:  "billing-group",
		dbURL:  url,
	}
	testenv.CleanupKeys(t, b.rdb, b.stream, consumer.DeadLetterStream(b.stream))
	if err := consumer.EnsureGroup(context.Background(), b.rdb, b.stream, b.group); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *bundle) config(t testing.TB, name string) consumer.Config {
	return consumer.Config{
		Redis: b.rdb, DB: b.pool, Schema: testenv.SchemaOf(b.pool), Stripe: b.stripe, Stream: b.stream, Group: b.group,
		Name: name, Namespace: "test", Block: 50 * time.Millisecond, Lease: 3 * time.Second,
		Logger: testenv.Logger(t), Clock: b.clk,
	}
}

func ev(i int) event.Event {
	return event.Event{CustomerID: fmt.Sprintf("c_%d", i), StripeCustomerID: fmt.Sprintf("cus_%d", i),
		AmountCents: int64(1000 + i), BillingPeriod: "2026-11", Currency: "usd"}
}

// add puts events on the stream and returns their ids.
func (b *bundle) add(t testing.TB, evs ...event.Event) []string {
	t.Helper()
	var ids []string
	for _, e := range evs {
		id, err := b.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: b.stream, Values: map[string]any{"payload": e.Payload()}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

func (b *bundle) addRaw(t testing.TB, values map[string]any) string {
	t.Helper()
	id, err := b.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: b.stream, Values: values}).Result()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// read delivers up to n new entries to consumer name (as XREADGROUP would
// for a consumer that then dies or stalls).
func (b *bundle) read(t testing.TB, name string, n int64) []redis.XMessage {
	t.Helper()
	res, err := b.rdb.XReadGroup(context.Background(), &redis.XReadGroupArgs{Group: b.group, Consumer: name,
		Streams: []string{b.stream, ">"}, Count: n, Block: -1}).Result()
	if err != nil {
		t.Fatal(err)
	}
	return res[0].Messages
}

// claim takes entries for name regardless of idle time, the way a takeover
// (a reaper or another consumer) would.
func (b *bundle) claim(t testing.TB, name string, ids ...string) []redis.XMessage {
	t.Helper()
	msgs, err := b.rdb.XClaim(context.Background(), &redis.XClaimArgs{Stream: b.stream, Group: b.group,
		Consumer: name, MinIdle: 0, Messages: ids}).Result()
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

func (b *bundle) pending(t testing.TB) int64 {
	t.Helper()
	p, err := b.rdb.XPending(context.Background(), b.stream, b.group).Result()
	if err != nil {
		t.Fatal(err)
	}
	return p.Count
}

// charges is the number of succeeded, unrefunded charges at the emulator for
// an event's (customer, period): the money-safety count.
func (b *bundle) charges(e event.Event) int {
	return b.sim.SucceededCharges(e.CustomerID, e.BillingPeriod)
}

func (b *bundle) record(t testing.TB, e event.Event) ledger.Record {
	t.Helper()
	r, err := b.ledger.Get(context.Background(), ledger.EventKey(e))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// status is the row's status, "" while there is none.
func (b *bundle) status(e event.Event) ledger.Status {
	r, err := b.ledger.Get(context.Background(), ledger.EventKey(e))
	if err != nil {
		return ""
	}
	return r.Status
}

// start runs a consumer until the test ends.
func start(t testing.TB, cfg consumer.Config) *consumer.Consumer {
	t.Helper()
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = c.Stop(ctx)
	})
	return c
}

func processor(t testing.TB, cfg consumer.Config) *consumer.Processor {
	t.Helper()
	p, err := consumer.NewProcessor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go p.RunHeartbeat(ctx)
	return p
}

func errorsAs(err error, target any) bool { return errors.As(err, target) }
