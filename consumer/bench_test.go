package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/naive"
	"github.com/pelguard/pelguard/internal/rollback"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// BenchmarkConsumer compares, in one run at emulator latency 0:
//   - pelguard: this consumer (validate, a read batch reserved at once,
//     Stripe, charges recorded and acked in groups);
//   - naive: the seed's consumer (XREADGROUP, Stripe, XACK; no ledger);
//   - ledger_floor: the per-event ledger statements alone (Reserve +
//     Finish), with the same concurrency: what the ledger cost per event
//     before the batching.
//
// Each reports events/s; issue 28's goals: pelguard ≥ 0.5 × naive and
// ≥ 1.0 × ledger_floor, in the same run.
// One op is benchEvents events, so `-benchtime 1x` (make bench) measures
// thousands. Run: make bench, or go test -run '^$' -bench BenchmarkConsumer -benchtime 1x -count 5 ./consumer/
func BenchmarkConsumer(b *testing.B) {
	const workers = 8
	b.Run("pelguard", func(b *testing.B) {
		n := benchEvents * b.N
		w := setupBench(b)
		w.seed(b, n)
		cfg := w.config(b, "")
		cfg.Workers = workers
		cfg.Count = 50
		cfg.Logger = testenv.Discard()
		// As every role runs: with the ledger witness (a bump in each
		// outcome's transaction, its mirror before the XACK).
		mon, err := rollback.New(rollback.Config{Schema: testenv.SchemaOf(w.pool), Writer: "consumer/bench", Redis: w.rdb, Logger: testenv.Discard()})
		if err != nil {
			b.Fatal(err)
		}
		if err := mon.Start(context.Background(), w.pool); err != nil {
			b.Fatal(err)
		}
		cfg.Witness = mon
		c, err := consumer.New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		start := time.Now()
		if err := c.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		w.waitCharged(b, n)
		elapsed := time.Since(start)
		b.StopTimer()
		_ = c.Stop(context.Background())
		mon.Close()
		b.ReportMetric(float64(n)/elapsed.Seconds(), "events/s")
	})
	b.Run("naive", func(b *testing.B) {
		n := benchEvents * b.N
		w := setupBench(b)
		w.seed(b, n)
		nc, err := naive.NewConsumer(naive.ConsumerConfig{Redis: w.rdb, Stream: w.stream, Group: w.group, Name: "naive",
			Count: 50, Block: 10 * time.Millisecond, Stripe: w.stripe, Logger: testenv.Discard()})
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		start := time.Now()
		var wg sync.WaitGroup
		ctx, cancel := context.WithCancel(context.Background())
		for range workers { // as many naive processes as pelguard has workers
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					if _, err := nc.RunOnce(ctx); err != nil && ctx.Err() == nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		testenv.Eventually(b, 5*time.Minute, func() bool { return w.sim.ChargeCreates() >= int64(n) && w.pending(b) == 0 }, "naive done")
		elapsed := time.Since(start)
		b.StopTimer()
		cancel()
		wg.Wait()
		b.ReportMetric(float64(n)/elapsed.Seconds(), "events/s")
	})
	b.Run("ledger_floor", func(b *testing.B) {
		n := benchEvents * b.N
		w := setupBench(b)
		evs := make(chan event.Event, n)
		for i := range n {
			evs <- ev(i)
		}
		close(evs)
		b.ResetTimer()
		start := time.Now()
		var wg sync.WaitGroup
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for e := range evs {
					c, err := w.ledger.Reserve(context.Background(), ledger.ReserveRequest{Event: e, IdempotencyKey: e.Key("test"),
						Owner: "floor", Lease: 30 * time.Second, MessageID: "0-1"})
					if err != nil {
						b.Error(err)
						return
					}
					if _, err := w.ledger.Finish(context.Background(), c.Record, ledger.Outcome{Status: ledger.StatusCharged, ChargeID: "ch_" + e.CustomerID}); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		b.ReportMetric(float64(n)/elapsed.Seconds(), "events/s")
	})
}

const benchEvents = 2000

func setupBench(b *testing.B) *bundle { return setup(b, opts{}) }

func (w *bundle) seed(b testing.TB, n int) {
	pipe := w.rdb.Pipeline()
	for i := range n {
		pipe.XAdd(context.Background(), &redis.XAddArgs{Stream: w.stream, Values: map[string]any{"payload": ev(i).Payload()}})
		if i%1000 == 999 {
			if _, err := pipe.Exec(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
	}
	if _, err := pipe.Exec(context.Background()); err != nil {
		b.Fatal(err)
	}
}

func (w *bundle) waitCharged(b *testing.B, n int) {
	testenv.Eventually(b, 10*time.Minute, func() bool {
		c, err := w.ledger.Counts(context.Background())
		return err == nil && c[ledger.StatusCharged] >= n && w.pending(b) == 0
	}, "%d charged", n)
}
