package rediscluster_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/reaper"
	"github.com/pelguard/pelguard/stripeapi"
)

const (
	testKey       = "sk_test_pelguard_cluster"
	testNamespace = "test"
	group         = "billing-group"
	period        = "2026-11"
)

// world is one run: streams on a Redis (cluster or single node), its own
// ledger schema, its own Stripe emulator, a consumer per stream and a reaper
// across all of them.
type world struct {
	rdb     redis.UniversalClient
	ledger  *ledger.Ledger
	pool    *pgxpool.Pool
	schema  string
	sim     *stripesim.Server
	stripe  *stripeapi.Client
	streams []string
	reg     *prometheus.Registry
	logger  *slog.Logger

	consumers []*consumer.Consumer
	reaper    *reaper.Reaper
}

type worldOpts struct {
	streams int
	latency time.Duration // emulator latency per request
	workers int           // per consumer
	count   int64         // XREADGROUP COUNT
}

// hashTagged names stream n billing-stream:{n}: the tag pins the stream and
// its dead-letter stream (billing-stream:{n}:dead) to one slot.
func hashTagged(prefix string, n int) string { return fmt.Sprintf("%s:{%d}", prefix, n) }

func newWorld(t testing.TB, rdb redis.UniversalClient, prefix string, o worldOpts) *world {
	t.Helper()
	ctx := context.Background()
	_, url := testenv.DBWithURL(t)
	// One pool for six consumers, their batch statements, heartbeats and
	// the reaper: more than testenv's 20 connections.
	pool, err := pg.Open(ctx, url, 60)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	sim, err := stripesim.New(stripesim.Config{Seed: 1, Faults: stripesim.Faults{Latency: stripesim.Latency{Fixed: o.latency}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	sc, err := stripeapi.New(stripeapi.Config{APIKey: testKey, BaseURL: sim.URL(), MaxNetworkRetries: 2, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	w := &world{rdb: rdb, pool: pool, schema: testenv.SchemaOfURL(url), ledger: ledger.New(pool, testenv.SchemaOfURL(url), nil), sim: sim, stripe: sc,
		reg: prometheus.NewRegistry(), logger: warnLogger(t)}
	for n := range o.streams {
		s := hashTagged(prefix, n)
		w.streams = append(w.streams, s)
		if err := consumer.EnsureGroup(ctx, rdb, s, group); err != nil {
			t.Fatal(err)
		}
		testenv.CleanupKeys(t, rdb, s)
		testenv.CleanupKeys(t, rdb, consumer.DeadLetterStream(s))
	}
	return w
}

func event0(i int) event.Event {
	return event.Event{CustomerID: "c_" + strconv.Itoa(i), StripeCustomerID: "cus_" + strconv.Itoa(i),
		AmountCents: int64(1000 + i%5000), BillingPeriod: period, Currency: "usd"}
}

// produce puts n events on the streams, event i on stream i mod len(streams),
// pipelined (the cluster client splits a pipeline by slot).
func (w *world) produce(t testing.TB, n int) {
	t.Helper()
	ctx := context.Background()
	pipe := w.rdb.Pipeline()
	for i := range n {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: w.streams[i%len(w.streams)], Values: map[string]any{event.PayloadField: event0(i).Payload()}})
		if pipe.Len() == 1000 {
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
}

// start runs one consumer per stream (sharing the Redis client, the ledger
// pool and the Stripe adapter) and one reaper over every stream.
func (w *world) start(t testing.TB, o worldOpts, minIdle time.Duration) {
	t.Helper()
	ctx := context.Background()
	cm := consumer.NewMetrics(w.reg)
	lease := 2 * time.Second // heartbeat every ~667 ms, below the reaper's min-idle
	for _, s := range w.streams {
		c, err := consumer.New(consumer.Config{
			Redis: w.rdb, DB: w.pool, Schema: w.schema, Stripe: w.stripe, Stream: s, Group: group,
			Namespace: testNamespace, Count: o.count, Workers: o.workers, Block: 100 * time.Millisecond,
			Lease: lease, Metrics: cm, Logger: w.logger,
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		w.consumers = append(w.consumers, c)
	}
	var sgs []reaper.StreamGroup
	for _, s := range w.streams {
		sgs = append(sgs, reaper.StreamGroup{Stream: s, Group: group})
	}
	r, err := reaper.New(reaper.Config{
		Redis: w.rdb, DB: w.pool, Schema: w.schema, Stripe: w.stripe, Streams: sgs,
		MinIdle: minIdle, Interval: 250 * time.Millisecond, Lease: lease, Namespace: testNamespace,
		Workers: 8, PageSize: 200, ConsumerIdle: -1,
		Metrics: reaper.NewMetrics(w.reg), Logger: w.logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	w.reaper = r
	t.Cleanup(func() { w.stop(t) })
}

func (w *world) stop(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, c := range w.consumers {
		wg.Go(func() { _ = c.Stop(ctx) })
	}
	if w.reaper != nil {
		wg.Go(func() { _ = w.reaper.Stop(ctx) })
	}
	wg.Wait()
	w.consumers, w.reaper = nil, nil
}

// settled reports whether every stream is fully consumed and drained: no
// entry pending (XPENDING 0) and nothing left to deliver (the group's
// last-delivered id is the stream's last id), and the ledger holds want
// terminal rows and nothing pending.
func (w *world) settled(ctx context.Context, want int) (bool, string) {
	counts, err := w.ledger.Counts(ctx)
	if err != nil {
		return false, err.Error()
	}
	terminal := counts[ledger.StatusCharged] + counts[ledger.StatusDeclined] + counts[ledger.StatusFailed]
	if terminal != want || counts[ledger.StatusPending] != 0 {
		return false, fmt.Sprintf("ledger %v", counts)
	}
	for _, s := range w.streams {
		p, err := w.rdb.XPending(ctx, s, group).Result()
		if err != nil {
			return false, fmt.Sprintf("XPENDING %s: %v", s, err)
		}
		if p.Count != 0 {
			return false, fmt.Sprintf("%s: %d pending", s, p.Count)
		}
		info, err := w.rdb.XInfoStream(ctx, s).Result()
		if err != nil {
			return false, fmt.Sprintf("XINFO STREAM %s: %v", s, err)
		}
		gs, err := w.rdb.XInfoGroups(ctx, s).Result()
		if err != nil || len(gs) != 1 {
			return false, fmt.Sprintf("XINFO GROUPS %s: %v", s, err)
		}
		if gs[0].LastDeliveredID != info.LastGeneratedID {
			return false, fmt.Sprintf("%s: delivered up to %s of %s", s, gs[0].LastDeliveredID, info.LastGeneratedID)
		}
	}
	return true, ""
}

func (w *world) waitSettled(t testing.TB, want int, timeout time.Duration) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(timeout)
	var why string
	for {
		var ok bool
		if ok, why = w.settled(ctx, want); ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not settled after %s: %s", timeout, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// outcomes sums a counter vector from the registry by its label.
func (w *world) outcomes(t testing.TB, metric string) map[string]float64 {
	t.Helper()
	mfs, err := w.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != metric {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				if l.GetName() != "stream" {
					labels = append(labels, l.GetValue())
				}
			}
			out[strings.Join(labels, ",")] += m.GetCounter().GetValue()
		}
	}
	return out
}

// envInt reads a positive integer from the environment, or def.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// warnLogger sends warnings and errors to t.Log: per-event debug lines would
// cost more than the run under -race.
func warnLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	defer func() { _ = recover() }() // t.Log after the test ended panics
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
