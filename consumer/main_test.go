package consumer_test

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/stripeapi"
)

// TestMain doubles as the child process of the kill tests: with
// PELGUARD_CHILD=kill-after-stripe, the test binary runs a consumer that
// SIGKILLs itself right after Stripe replies, before the ledger write and
// the XACK; with meter-consumer, a meter consumer until it is killed; with
// ledger-meter-consumer, one sending from the ledger.
func TestMain(m *testing.M) {
	switch os.Getenv("PELGUARD_CHILD") {
	case "kill-after-stripe":
		os.Exit(runChild())
	case "meter-consumer":
		os.Exit(runMeterChild())
	case "ledger-meter-consumer":
		os.Exit(runLedgerMeterChild())
	}
	os.Exit(m.Run())
}

func runChild() int {
	ctx := context.Background()
	opt, err := redis.ParseURL(os.Getenv("CHILD_REDIS_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	rdb := redis.NewClient(opt)
	pool, err := pg.Open(ctx, os.Getenv("CHILD_DATABASE_URL"), 4)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	sc, err := stripeapi.New(stripeapi.Config{APIKey: testKey, BaseURL: os.Getenv("CHILD_STRIPE_URL"), MaxNetworkRetries: -1})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	c, err := consumer.New(consumer.Config{
		Redis: rdb, DB: pool, Schema: os.Getenv("CHILD_DB_SCHEMA"), Stripe: sc,
		Stream: os.Getenv("CHILD_STREAM"), Group: os.Getenv("CHILD_GROUP"), Name: "child",
		Namespace: "test", Lease: time.Second, Block: 50 * time.Millisecond,
		Test: consumer.TestConfig{AfterStripeReply: func() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL) }},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	if err := c.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	<-c.Done()
	return 4 // never reached: the hook kills the process
}
