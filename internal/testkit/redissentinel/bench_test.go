package redissentinel_test

import (
	"context"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/redisurl"
	"github.com/pelguard/pelguard/stripeapi"
)

// BenchmarkConsumerSentinelVsDirect bills 2,000 events with one consumer
// (8 workers, COUNT 50, emulator latency 0) on the same primary of a local
// Sentinel set, opened once through its redis+sentinel:// URL and once
// through the primary's own redis:// URL, one after the other in each op
// (the order alternating from op to op, so that neither always runs on a
// warmer machine), after a run not measured. Each reports events/s from the consumer's start until
// every event is charged and acked, and their ratio:
//
//	go test -run '^$' -bench BenchmarkConsumerSentinelVsDirect -benchtime 1x -count 5 ./internal/testkit/redissentinel/
func BenchmarkConsumerSentinelVsDirect(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// go-redis's sentinel lines would break the benchmark's output lines.
	redis.SetLogger(quiet{})
	set, err := startBenchSet(ctx, b)
	if err != nil {
		b.Fatal(err)
	}
	primary, err := set.Primary(ctx)
	if err != nil {
		b.Fatal(err)
	}
	urls := map[string]string{
		"sentinel": set.URL(),
		"direct":   "redis://" + url.UserPassword("", "data-Pw@1").String() + "@" + primary.Addr() + "/0",
	}
	order := []string{"sentinel", "direct"}
	if benchOp.Add(1)%2 == 0 {
		order = []string{"direct", "sentinel"}
	}
	rates := map[string]float64{}
	b.StopTimer()
	// A run first, not measured: the first run of a process is the
	// slowest (connections, caches), whichever URL it takes.
	warm, err := redisurl.Open(urls["direct"])
	if err != nil {
		b.Fatal(err)
	}
	billOnce(b, warm, 1000)
	_ = warm.Close()
	for range b.N {
		for _, name := range order {
			rdb, err := redisurl.Open(urls[name])
			if err != nil {
				b.Fatal(err)
			}
			rates[name] += billOnce(b, rdb, 2000) / float64(b.N)
			_ = rdb.Close()
		}
	}
	b.ReportMetric(rates["sentinel"], "sentinel_events/s")
	b.ReportMetric(rates["direct"], "direct_events/s")
	b.ReportMetric(rates["sentinel"]/rates["direct"], "ratio")
}

// benchOp counts the benchmark's runs (-count) to alternate the order.
var benchOp atomic.Int64

func billOnce(b *testing.B, rdb redis.UniversalClient, n int) float64 {
	ctx := context.Background()
	pool := testenv.DB(b)
	sim := stripesim.MustNew(stripesim.Config{Seed: 1})
	b.Cleanup(sim.Close)
	sc, err := stripeapi.New(stripeapi.Config{APIKey: "sk_test_pelguard_sentinel", BaseURL: sim.URL(), Timeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	stream := testenv.Name(b, "bench")
	if err := consumer.EnsureGroup(ctx, rdb, stream, "billing-group"); err != nil {
		b.Fatal(err)
	}
	pipe := rdb.Pipeline()
	for i := range n {
		ev := event.Event{CustomerID: "c_" + strconv.Itoa(i), StripeCustomerID: "cus_" + strconv.Itoa(i), AmountCents: 100,
			BillingPeriod: "2026-11", Currency: "usd"}
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{event.PayloadField: ev.Payload()}})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	c, err := consumer.New(consumer.Config{Redis: rdb, DB: pool, Schema: testenv.SchemaOf(pool), Stripe: sc, Stream: stream,
		Group: "billing-group", Namespace: "bench", Count: 50, Workers: 8, Block: 100 * time.Millisecond, Logger: testenv.Discard()})
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		b.Fatal(err)
	}
	testenv.Eventually(b, 5*time.Minute, func() bool {
		p, err := rdb.XPending(ctx, stream, "billing-group").Result()
		return sim.ChargeCreates() >= int64(n) && err == nil && p.Count == 0
	}, "every event charged and acked")
	elapsed := time.Since(start)
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_ = c.Stop(stopCtx)
	return float64(n) / elapsed.Seconds()
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}
