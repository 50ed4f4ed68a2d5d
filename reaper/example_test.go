package reaper_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/reaper"
	"github.com/pelguard/pelguard/stripeapi"
)

// The reaper beside the consumers, built from the service's own clients; its
// Namespace and Schema must match the consumers'. It needs Redis and
// Postgres, so this example only compiles (examples/embed runs the same).
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
	stripe, err := stripeapi.New(stripeapi.Config{APIKey: os.Getenv("STRIPE_API_KEY")})
	if err != nil {
		logger.Error("stripe", "error", err)
		return
	}

	r, err := reaper.New(reaper.Config{
		Redis: rdb, DB: pool, Schema: "pelguard", Stripe: stripe,
		Streams:   []reaper.StreamGroup{{Stream: "billing-stream", Group: "billing-group"}},
		Namespace: "prod", Logger: logger, Metrics: reaper.NewMetrics(prometheus.DefaultRegisterer),
	})
	if err != nil {
		logger.Error("reaper", "error", err)
		return
	}
	if err := r.Start(ctx); err != nil { // a pass now and every Interval
		logger.Error("start", "error", err)
		return
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.Stop(stopCtx) // idempotent; safe before Start
	}()
}

// One pass from a cron job (`reaper --once`): RunOnce waits for the pass's
// re-drives and counts what it decided. Compile-only: it needs Redis and
// Postgres.
func ExampleReaper_RunOnce() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return
	}
	defer pool.Close()
	stripe, err := stripeapi.New(stripeapi.Config{APIKey: os.Getenv("STRIPE_API_KEY")})
	if err != nil {
		return
	}
	r, err := reaper.New(reaper.Config{Redis: rdb, DB: pool, Stripe: stripe, Namespace: "prod",
		Streams: []reaper.StreamGroup{{Stream: "billing-stream", Group: "billing-group"}}})
	if err != nil {
		return
	}
	sum, err := r.RunOnce(ctx)
	if err != nil {
		return
	}
	fmt.Println(sum.Scanned, sum.Decisions[reaper.KindAlreadyBilled], sum.Decisions[reaper.KindClaim])
}

// New validates the Config; its errors name the fix. A dry run, which
// decides and reports but changes nothing, needs no Stripe key. Building a
// reaper connects to nothing: the clients here are never used.
func ExampleNew() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:5432/postgres")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	streams := []reaper.StreamGroup{{Stream: "billing-stream", Group: "billing-group"}}

	_, err = reaper.New(reaper.Config{Redis: rdb, DB: pool, Streams: streams})
	fmt.Println(err)
	_, err = reaper.New(reaper.Config{Redis: rdb, DB: pool, Streams: streams, DryRun: true, MinIdle: time.Microsecond})
	fmt.Println(err)
	r, err := reaper.New(reaper.Config{Redis: rdb, DB: pool, Streams: streams, DryRun: true})
	fmt.Println(strings.HasPrefix(r.Name(), "reaper-"), err)
	// Output:
	// reaper: Stripe client is required (only --dry-run runs without one)
	// reaper: --min-idle 1µs must be at least 1ms (it is the XCLAIM fence)
	// true <nil>
}
