package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/migrations"
	"github.com/pelguard/pelguard/stripeapi"
)

// A team's own service runs the consumer with its own Redis client,
// Postgres pool and Stripe key (examples/embed is the same code, tested).
// It needs Redis and Postgres, so this example only compiles.
func Example() {
	ctx := context.Background()
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		logger.Error("postgres", "error", err)
		return
	}
	defer pool.Close()

	// Once per deploy: pelguard's tables, in a schema of their own.
	m, err := migrations.New(pool, "pelguard", logger)
	if err != nil {
		logger.Error("migrations", "error", err)
		return
	}
	defer m.Close()
	if _, err := m.Up(ctx); err != nil {
		logger.Error("migrate up", "error", err)
		return
	}

	stripe, err := stripeapi.New(stripeapi.Config{APIKey: os.Getenv("STRIPE_API_KEY")})
	if err != nil {
		logger.Error("stripe", "error", err)
		return
	}
	c, err := consumer.New(consumer.Config{
		Redis: rdb, DB: pool, Schema: "pelguard", Stripe: stripe,
		Stream: "billing-stream", Group: "billing-group", Namespace: "prod",
		Logger: logger, Metrics: consumer.NewMetrics(prometheus.DefaultRegisterer),
	})
	if err != nil {
		logger.Error("consumer", "error", err)
		return
	}
	if err := c.Start(ctx); err != nil { // creates the group if missing
		logger.Error("start", "error", err)
		return
	}
	defer func() {
		// Stop lets Stripe calls in flight finish and record their outcome.
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Stop(stopCtx)
	}()

	// A producer adds events in the canonical form.
	ev := event.Event{CustomerID: "c_42", StripeCustomerID: "cus_ABC", AmountCents: 2500, BillingPeriod: "2026-11", Currency: "usd"}
	rdb.XAdd(ctx, &redis.XAddArgs{Stream: "billing-stream", Values: map[string]any{event.PayloadField: ev.Payload()}})
}

// New applies the defaults and validates the Config; its errors name the
// fix. Building a consumer connects to nothing: the clients here are never
// used.
func ExampleNew() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:5432/postgres")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	stripe, err := stripeapi.New(stripeapi.Config{APIKey: "sk_test_example"})
	if err != nil {
		fmt.Println(err)
		return
	}

	_, err = consumer.New(consumer.Config{Redis: rdb, DB: pool, Stripe: stripe, Group: "billing-group"})
	fmt.Println(err)
	_, err = consumer.New(consumer.Config{Redis: rdb, DB: pool, Stripe: stripe, Stream: "billing-stream", Group: "billing-group",
		SafeKeyWindow: 25 * time.Hour})
	fmt.Println(err)
	c, err := consumer.New(consumer.Config{Redis: rdb, DB: pool, Stripe: stripe, Stream: "billing-stream", Group: "billing-group",
		Name: "billing-0"})
	fmt.Println(c.Name(), c.Stream(), err)
	// Output:
	// consumer: --stream is required
	// consumer: --safe-key-window 25h0m0s must be below Stripe's 24h idempotency window
	// billing-0 billing-stream <nil>
}

// What a producer puts in the stream's "payload" field, and the idempotency
// key the consumer sends to Stripe for it: business identity only, so a
// redelivery, a reclaim or a replay of the same event all carry the same key.
func Example_event() {
	ev := event.Event{CustomerID: "c_42", StripeCustomerID: "cus_ABC", AmountCents: 2500, BillingPeriod: "2026-11", Currency: "usd"}
	fmt.Println(ev.Payload())

	parsed, err := event.Parse([]byte(ev.Payload()), event.Rules{})
	fmt.Println(parsed == ev, err)
	fmt.Println(event.IdempotencyKey("c_42", "2026-11", "prod") == parsed.Key("prod"))

	_, err = event.Parse([]byte(`{"customer_id":"c_42","stripe_customer_id":"cus_ABC","amount_cents":0,"billing_period":"2026-11"}`), event.Rules{})
	fmt.Println(event.Reason(err))
	// Output:
	// {"customer_id":"c_42","stripe_customer_id":"cus_ABC","amount_cents":2500,"billing_period":"2026-11","currency":"usd"}
	// true <nil>
	// true
	// amount_not_positive
}
