package consumer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
	"github.com/pelguard/pelguard/stripelimit"
)

// Issue 28's fleet figure: meter events at Stripe's live limit.
const (
	fleetLimit     = stripelimit.MeterEventsRate // Stripe's live meter-events limit, per second
	fleetLatency   = 100 * time.Millisecond
	fleetCustomers = 2000
	fleetConsumers = 3
	fleetConnsEach = 5 // Postgres connections per consumer: 15 in all, within the 16
)

// fleetEvents is the events of one op: PELGUARD_BENCH_FLEET_EVENTS, else
// 15 seconds' worth at the limit.
func fleetEvents() int {
	if n, err := strconv.Atoi(os.Getenv("PELGUARD_BENCH_FLEET_EVENTS")); err == nil && n > 0 {
		return n
	}
	return 15 * fleetLimit
}

// BenchmarkMeterFleet: a fleet of three meter consumers against the
// emulator limiting meter events at 1,000/s with 100 ms latency, 2,000
// customers equally active, the fleet's meter-events limiter shared through
// Redis (stripelimit.Config.ForMeterEvents):
//   - pelguard: the meter consumer (reserve and finish per batch in the
//     meter ledger, one call per customer and meter across the fleet);
//   - naive: the same fleet and limiter without a ledger (XREADGROUP, the
//     calls, XACK), what the ledger costs by comparison.
//
// Each reports events/s and x_limit (events/s ÷ 1,000) over the whole run,
// from the first read to the last event recorded; steady_x_limit, the same
// between the 10th and the 90th percent of the events recorded (the rate
// the fleet holds, without the first calls' latency and the last
// customers' events, which follow each other one call at a time); pct_429
// (Stripe's 429s per call) and pg_conns (the fleet's Postgres connections
// at their peak).
// Run: make bench, or go test -run '^$' -bench BenchmarkMeterFleet -benchtime 1x -count 5 ./consumer/
func BenchmarkMeterFleet(b *testing.B) {
	for _, mode := range []string{"pelguard", "naive"} {
		b.Run(mode, func(b *testing.B) {
			n := fleetEvents() * b.N
			f := newFleet(b, n)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for i := range fleetConsumers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if mode == "pelguard" {
						f.runPelguard(ctx, b, i)
					} else {
						f.runNaive(ctx, b, i)
					}
				}()
			}
			peak, steady := f.waitRecorded(b, n)
			elapsed := time.Since(start)
			b.StopTimer()
			cancel()
			wg.Wait()
			c := f.sim.MeterEventCounts()
			calls := c.Recorded + c.Duplicates + c.Concurrent + c.RateLimited + c.Invalid
			rate := float64(n) / elapsed.Seconds()
			b.ReportMetric(rate, "events/s")
			b.ReportMetric(rate/fleetLimit, "x_limit")
			b.ReportMetric(steady/fleetLimit, "steady_x_limit")
			b.ReportMetric(100*float64(c.Concurrent+c.RateLimited)/float64(max(calls, 1)), "pct_429")
			b.ReportMetric(float64(peak), "pg_conns")
			if mode == "pelguard" {
				for cus, want := range f.want {
					if got := f.sim.MeterTotal(benchMeter, cus); got != want {
						b.Fatalf("%s: Stripe counts %d, the events add up to %d", cus, got, want)
					}
				}
			}
		})
	}
}

const benchMeter = "api_requests"

type fleet struct {
	sim     *stripesim.Server
	rdb     *redis.Client
	url     string
	schema  string
	stream  string
	group   string
	account string
	want    map[string]int64
	pools   []*pgxpool.Pool
	mu      sync.Mutex
}

func newFleet(b *testing.B, n int) *fleet {
	b.Helper()
	pool, url := testenv.DBWithURL(b)
	sim, err := stripesim.New(stripesim.Config{Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(sim.Close)
	if _, err := sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: benchMeter}); err != nil {
		b.Fatal(err)
	}
	if err := sim.SetFaults(stripesim.Faults{MeterEventLatency: fleetLatency, MeterEventRateLimit: fleetLimit}); err != nil {
		b.Fatal(err)
	}
	f := &fleet{sim: sim, rdb: testenv.Redis(b), url: url, schema: testenv.SchemaOf(pool),
		stream: testenv.Name(b, "usage"), group: "meters", account: "bench" + testenv.Suffix(), want: map[string]int64{}}
	testenv.CleanupKeys(b, f.rdb, f.stream, consumer.DeadLetterStream(f.stream))
	b.Cleanup(func() {
		keys, _ := f.rdb.Keys(context.Background(), stripelimit.KeyPrefix+"*"+f.account+"*").Result()
		if len(keys) > 0 {
			f.rdb.Del(context.Background(), keys...)
		}
	})
	ctx := context.Background()
	if err := consumer.EnsureGroup(ctx, f.rdb, f.stream, f.group); err != nil {
		b.Fatal(err)
	}
	l, err := meterledger.New(pool, meterledger.Config{Schema: f.schema})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := l.EnsurePartitions(ctx, time.Now()); err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	now := time.Now().Add(-time.Minute).Truncate(time.Second)
	pipe := f.rdb.Pipeline()
	for i := range n {
		e := event.MeterEvent{EventName: benchMeter, StripeCustomerID: fmt.Sprintf("cus_%d", rng.IntN(fleetCustomers)),
			Value: int64(1 + i%5), Timestamp: now, EventID: fmt.Sprintf("req-%d", i)}
		f.want[e.StripeCustomerID] += e.Value
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: f.stream, Values: map[string]any{"payload": e.Payload()}})
		if pipe.Len() == 1000 || i == n-1 {
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	return f
}

// client is one consumer's Stripe client: live mode, its meter events
// paced by the fleet's shared meter-events schedule.
func (f *fleet) client(b *testing.B, backoff time.Duration) *stripeapi.Client {
	b.Helper()
	lim, err := stripelimit.New(stripelimit.Config{Account: f.account, Rate: 100, Redis: f.rdb, Backoff: backoff}.ForMeterEvents())
	if err != nil {
		b.Fatal(err)
	}
	sc, err := stripeapi.New(stripeapi.Config{APIKey: "sk_live_pelguard_fleet", AllowUnrestrictedKey: true, BaseURL: f.sim.URL(),
		MaxNetworkRetries: -1, Timeout: 10 * time.Second, MeterLimiter: lim, Logger: testenv.Discard()})
	if err != nil {
		b.Fatal(err)
	}
	return sc
}

func (f *fleet) runPelguard(ctx context.Context, b *testing.B, i int) {
	cfg, err := pgxpool.ParseConfig(f.url)
	if err != nil {
		b.Error(err)
		return
	}
	cfg.MaxConns = fleetConnsEach
	pool, err := pg.OpenConfig(ctx, cfg)
	if err != nil {
		b.Error(err)
		return
	}
	defer pool.Close()
	f.mu.Lock()
	f.pools = append(f.pools, pool)
	f.mu.Unlock()
	c, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: f.rdb, DB: pool, Schema: f.schema, Stripe: f.client(b, 0),
		Stream: f.stream, Group: f.group, Name: fmt.Sprintf("meter-%d", i), Namespace: "bench",
		Count: 100, Block: 20 * time.Millisecond, Workers: 64, Pipeline: 3, Logger: testenv.Discard()})
	if err != nil {
		b.Error(err)
		return
	}
	if err := c.Run(ctx); err != nil {
		b.Error(err)
	}
}

// runNaive is a sender without a ledger: read 100, send them 64 at a time
// (a customer's events one after another, as Stripe wants), ack what Stripe
// took; what it refused is read again from this consumer's PEL. Its limiter
// does not pause the fleet after a 429: the calls of three processes that
// do not coordinate collide on a customer now and then, and the baseline
// is what the calls alone achieve.
func (f *fleet) runNaive(ctx context.Context, b *testing.B, i int) {
	sc := f.client(b, -1)
	name := fmt.Sprintf("naive-%d", i)
	from := ">"
	for ctx.Err() == nil {
		res, err := f.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: f.group, Consumer: name,
			Streams: []string{f.stream, from}, Count: 100, Block: 20 * time.Millisecond}).Result()
		if err != nil || len(res[0].Messages) == 0 {
			from = ">"
			continue
		}
		byCustomer := map[string][]redis.XMessage{}
		evs := map[string]event.MeterEvent{}
		for _, m := range res[0].Messages {
			ev, err := event.ParseMeterFields(m.Values, event.MeterRules{}, time.Now())
			if err != nil {
				continue
			}
			evs[m.ID] = ev
			byCustomer[ev.StripeCustomerID] = append(byCustomer[ev.StripeCustomerID], m)
		}
		var acks []string
		var mu sync.Mutex
		slots := make(chan struct{}, 64)
		var wg sync.WaitGroup
		for _, ms := range byCustomer {
			wg.Add(1)
			slots <- struct{}{}
			go func() {
				defer func() { <-slots; wg.Done() }()
				for _, m := range ms {
					ev := evs[m.ID]
					if _, err := sc.SendMeterEvent(ctx, stripeapi.MeterEvent{EventName: ev.EventName, StripeCustomerID: ev.StripeCustomerID,
						Value: ev.Value, Identifier: ev.Identifier("bench"), Timestamp: ev.Timestamp}); err == nil {
						mu.Lock()
						acks = append(acks, m.ID)
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
		if len(acks) > 0 {
			f.rdb.XAck(context.Background(), f.stream, f.group, acks...)
		}
		from = ">"
		if len(acks) < len(res[0].Messages) {
			from = "0"
		}
	}
}

// waitRecorded waits until the emulator has recorded n events and returns
// the fleet's peak of open Postgres connections meanwhile, and its rate
// between 10 % and 90 % of the events recorded.
func (f *fleet) waitRecorded(b *testing.B, n int) (peak int32, steady float64) {
	deadline := time.Now().Add(time.Duration(n/fleetLimit)*time.Second*10 + time.Minute)
	lo, hi := int64(n)/10, int64(n)*9/10
	var loAt, hiAt time.Time
	var loN, hiN int64
	for {
		recorded := f.sim.MeterEventCounts().Recorded
		if loAt.IsZero() && recorded >= lo {
			loAt, loN = time.Now(), recorded
		}
		if hiAt.IsZero() && recorded >= hi {
			hiAt, hiN = time.Now(), recorded
		}
		if recorded >= int64(n) {
			break
		}
		if time.Now().After(deadline) || b.Failed() {
			b.Fatalf("only %d of %d events recorded (emulator %+v)", f.sim.MeterEventCounts().Recorded, n, f.sim.MeterEventCounts())
		}
		f.mu.Lock()
		var open int32
		for _, p := range f.pools {
			open += p.Stat().TotalConns()
		}
		f.mu.Unlock()
		peak = max(peak, open)
		time.Sleep(10 * time.Millisecond)
	}
	if d := hiAt.Sub(loAt); d > 0 {
		steady = float64(hiN-loN) / d.Seconds()
	}
	return peak, steady
}
