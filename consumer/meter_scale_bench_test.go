package consumer_test

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/internal/watermark"
)

// BenchmarkUsageAtScale is usage at volume end to end, at full scale: one
// busy customer (cus_0) at 5,000 events/s and 10,000 quiet customers at
// 0.05 events/s each (500/s between them) for 60 s, 330,000 events on one
// sum meter, produced into Redis by one goroutine (pipelined XADDs every
// 20 ms); two meter consumers with the default batch, pipeline and
// workers, each on a Postgres pool of 8 connections (16 between them, as
// two processes with --max-db-conns 8 would hold); spend caps on the meter
// (one for cus_0, one for every customer, never reached: every event is
// counted against its cap at ingest); Stripe answering each meter event in
// 100 ms, about what a live call takes from a nearby region. Modes:
//   - aggregated: SendFromLedger with the meter in AggregateMeters;
//   - per_event: today's path from the pending entries. It cannot keep up:
//     it is stopped scaleCap after the last event and reports how far it
//     got.
//
// Reported (b.ReportMetric; the log line repeats them with the emulator's
// counts):
//   - produced_events/s: what the producer achieved (target 5,500);
//   - ingest_events/s, ingest_lag_s_p99, ingest_lag_s_max (aggregated):
//     ledger rows over the span of their created_at, and how long after
//     its stream entry was added each row was written;
//   - busy_lag_s_max, busy_lag_s_p90, busy_lag_s_median, quiet_lag_s_max,
//     quiet_lag_s_median: how far counted usage at Stripe trailed
//     production (the age of the oldest unit produced and not yet
//     counted; busy sampled every 100 ms, quiet every second, from the
//     first event to the end); busy_lag_s_max_first_10s: the busy
//     customer's over the first 10 s of production, while the day's
//     partition is new (as at each UTC midnight);
//   - pg_checkpoints: checkpoints the Postgres server started during the
//     run (at this volume, one each time the WAL grows by about half of
//     max_wal_size); wal_bytes/event: WAL the server wrote during the run
//     per event produced (every session's, the run's own nearly all);
//   - calls, calls_recorded, calls_duplicate, calls_concurrent,
//     calls_rate_limited: Stripe's answers; tuples: the distinct
//     (customer, meter, second) of the events produced; late_joins:
//     aggregates formed after another of the same bucket; arrival_splits:
//     a second's events sent as more than one bucket because some entries
//     were added in the next second;
//   - customers_short: customers whose usage was not all counted at the
//     end; counted_share: the units counted over those produced;
//   - drain_s: from the last event to everything counted (or the cap);
//   - pg_conns_max: the consumers' Postgres connections at the peak;
//   - watermark_lag_s_median, watermark_lag_s_max: how far the group's
//     ingest watermark trailed the clock while events were produced (a
//     second's aggregate is formed only once the watermark has passed it).
//
// Run: go test -run '^$' -bench BenchmarkUsageAtScale -benchtime 1x -count 1 ./consumer/
// PELGUARD_BENCH_SCALE_SECONDS shortens the production (default 60);
// PELGUARD_BENCH_SCALE_WORKERS, _PIPELINE, _SLOTS and _COUNT set
// MeterConfig's Workers, Pipeline, SendSlots and Count (default: theirs).
func BenchmarkUsageAtScale(b *testing.B) {
	for _, mode := range []string{"aggregated", "per_event"} {
		b.Run(mode, func(b *testing.B) {
			for range b.N {
				runScaleBench(b, mode)
			}
		})
	}
}

const (
	scaleBusyRate  = 5000
	scaleQuiet     = 10000
	scaleQuietRate = 500 // 0.05 events/s each
	scaleTick      = 20 * time.Millisecond
	scaleLatency   = 100 * time.Millisecond
	scaleCap       = 60 * time.Second
	scaleConns     = 8 // per consumer
)

func scaleEnv(b *testing.B, name string, def int) int {
	v := os.Getenv("PELGUARD_BENCH_SCALE_" + name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("PELGUARD_BENCH_SCALE_%s=%q: want a positive integer", name, v)
	}
	return n
}

// scaleRun is what the producer and the sampler share.
type scaleRun struct {
	mu          sync.Mutex
	busy, quiet usageCurve
	produced    int
	producing   bool
	last        time.Time // the last event added
	busyLags    []time.Duration
	quietLags   []time.Duration
	// markLags: how far the group's ingest watermark trails the clock
	// while the producer runs (an aggregate waits for it).
	markLags []time.Duration
	// busyStartMax: the busy customer's largest lag within scaleStart of
	// its first event.
	busyStartMax time.Duration
	conns        int32
}

// scaleStart is the start of production the busy lag is also reported
// over: a new day's partition before its first analyze.
const scaleStart = 10 * time.Second

func runScaleBench(b *testing.B, mode string) {
	b.StopTimer()
	seconds := scaleEnv(b, "SECONDS", 60)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := setup(b, opts{simNow: time.Now().UTC()})
	if _, err := w.sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: meterName}); err != nil {
		b.Fatal(err)
	}
	if err := w.sim.SetFaults(stripesim.Faults{MeterEventLatency: scaleLatency}); err != nil {
		b.Fatal(err)
	}
	l, err := meterledger.New(w.pool, meterledger.Config{Schema: testenv.SchemaOf(w.pool)})
	if err != nil {
		b.Fatal(err)
	}
	for _, cus := range []string{"cus_0", meterledger.AnyCustomer} {
		if _, err := l.SetCap(ctx, meterledger.Cap{EventName: meterName, StripeCustomerID: cus,
			Month: meterledger.AnyMonth, Cap: 1 << 50}); err != nil {
			b.Fatal(err)
		}
	}
	var pools []*pgxpool.Pool
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for _, name := range []string{"scale-a", "scale-b"} {
		pool, err := pg.Open(ctx, w.dbURL, scaleConns)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(pool.Close) // after the consumers stop, before the schema is dropped
		pools = append(pools, pool)
		cfg := consumer.MeterConfig{Redis: w.rdb, DB: pool, Schema: testenv.SchemaOf(w.pool), Stripe: w.stripe,
			Stream: w.stream, Group: w.group, Name: name, Namespace: "test",
			Workers: scaleEnv(b, "WORKERS", 0), Pipeline: scaleEnv(b, "PIPELINE", 0), SendSlots: scaleEnv(b, "SLOTS", 0), Count: int64(scaleEnv(b, "COUNT", 0))}
		if mode == "aggregated" {
			cfg.SendFromLedger, cfg.AggregateMeters = true, []string{meterName}
		}
		c, err := consumer.NewMeterConsumer(cfg)
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = c.Run(ctx) }()
	}

	server0 := readServer(ctx, b, w.pool, serverFigures{})
	r := &scaleRun{producing: true}
	b.StartTimer()
	start := time.Now()
	sampled := make(chan struct{})
	go r.sample(ctx, w.sim, pools, sampled, func() (time.Time, error) {
		m, err := watermark.Read(ctx, w.rdb, w.stream, w.group)
		return m.Time(), err
	})
	totals, tuples, prodStats := r.produce(ctx, b, w.rdb, w.stream, start, seconds)
	<-sampled
	drained := time.Since(r.last)
	b.StopTimer()
	server := readServer(context.Background(), b, w.pool, server0)
	cancel()
	wg.Wait()

	// What Stripe counted, per customer: never more than produced.
	counted := map[string]int64{}
	for _, e := range w.sim.MeterEvents(meterName, "") {
		counted[e.Customer] += e.Value
		if mode == "aggregated" && !strings.HasPrefix(e.Identifier, "pga_") {
			b.Errorf("event %s of %s counted outside an aggregate", e.Identifier, e.Customer)
		}
	}
	short := 0
	var producedUnits, countedUnits int64
	for cus, v := range totals {
		got := counted[cus]
		if got > v {
			b.Fatalf("%s: Stripe counts %d, more than the %d produced", cus, got, v)
		}
		if got < v {
			short++
		}
		producedUnits, countedUnits = producedUnits+v, countedUnits+got
	}
	c := w.sim.MeterEventCounts()
	if c.Invalid != 0 || c.Rejected != 0 {
		b.Fatalf("the emulator refused %d meter events as invalid and rejected %d", c.Invalid, c.Rejected)
	}
	calls := c.Recorded + c.Duplicates + c.Concurrent + c.RateLimited
	b.ReportMetric(prodStats.rate, "produced_events/s")
	r.mu.Lock()
	b.ReportMetric(percentile(r.busyLags, 1).Seconds(), "busy_lag_s_max")
	b.ReportMetric(percentile(r.busyLags, 0.5).Seconds(), "busy_lag_s_median")
	b.ReportMetric(percentile(r.busyLags, 0.9).Seconds(), "busy_lag_s_p90")
	b.ReportMetric(r.busyStartMax.Seconds(), "busy_lag_s_max_first_10s")
	b.ReportMetric(percentile(r.quietLags, 1).Seconds(), "quiet_lag_s_max")
	b.ReportMetric(percentile(r.quietLags, 0.5).Seconds(), "quiet_lag_s_median")
	b.ReportMetric(float64(r.conns), "pg_conns_max")
	b.ReportMetric(percentile(r.markLags, 0.5).Seconds(), "watermark_lag_s_median")
	b.ReportMetric(percentile(r.markLags, 1).Seconds(), "watermark_lag_s_max")
	r.mu.Unlock()
	b.ReportMetric(float64(calls), "calls")
	b.ReportMetric(float64(c.Recorded), "calls_recorded")
	b.ReportMetric(float64(c.Duplicates), "calls_duplicate")
	b.ReportMetric(float64(c.Concurrent), "calls_concurrent")
	b.ReportMetric(float64(c.RateLimited), "calls_rate_limited")
	b.ReportMetric(float64(tuples), "tuples")
	b.ReportMetric(float64(short), "customers_short")
	b.ReportMetric(float64(countedUnits)/float64(producedUnits), "counted_share")
	b.ReportMetric(drained.Seconds(), "drain_s")
	b.ReportMetric(float64(server.checkpoints), "pg_checkpoints")
	b.ReportMetric(server.walBytes/float64(r.produced), "wal_bytes/event")
	ing := ingestStats(context.Background(), b, w.pool)
	agg := aggregateStats(context.Background(), b, w.pool)
	if mode == "aggregated" {
		b.ReportMetric(ing.rate, "ingest_events/s")
		b.ReportMetric(ing.lagP99, "ingest_lag_s_p99")
		b.ReportMetric(ing.lagMax, "ingest_lag_s_max")
		b.ReportMetric(float64(agg.late), "late_joins")
		b.ReportMetric(float64(agg.splits), "arrival_splits")
	}
	b.Logf("%s: %d events produced in %d s (%.0f/s, slowest tick's XADDs %s); %s from the last event until counted or the cap; "+
		"emulator %+v; %d tuples; ledger rows %d (written over %.1f s: %.0f/s; entry to row p50 %.3f s, p99 %.3f s, max %.3f s); "+
		"aggregates %d (%d buckets, %d late joins, %d arrival splits); %d of %d customers short, %.4f of the units counted; "+
		"Postgres: %d checkpoints, %.0f MB of WAL",
		mode, r.produced, seconds, prodStats.rate, prodStats.slowest.Round(time.Millisecond), drained.Round(time.Millisecond),
		c, tuples, ing.rows, ing.span, ing.rate, ing.lagP50, ing.lagP99, ing.lagMax,
		agg.total, agg.buckets, agg.late, agg.splits, short, len(totals), float64(countedUnits)/float64(producedUnits),
		server.checkpoints, server.walBytes/1e6)
}

type producerStats struct {
	rate    float64       // events added per second of production
	slowest time.Duration // the longest one tick's pipelined XADDs took
}

// produce adds the events due at each tick in one pipeline, until
// seconds of production; it returns each customer's units, the number of
// distinct (customer, meter, second) tuples, and its own pace.
func (r *scaleRun) produce(ctx context.Context, b *testing.B, rdb redis.UniversalClient, stream string, start time.Time,
	seconds int) (map[string]int64, int, producerStats) {
	totals := map[string]int64{}
	type tuple struct {
		cus int
		sec int64
	}
	seen := map[tuple]struct{}{}
	var st producerStats
	busyN, quietN := 0, 0
	busyAll, quietAll := scaleBusyRate*seconds, scaleQuietRate*seconds
	tick := time.NewTicker(scaleTick)
	defer tick.Stop()
	pipe := rdb.Pipeline()
	for busyN < busyAll || quietN < quietAll {
		<-tick.C
		at := time.Now()
		el := at.Sub(start)
		dueBusy := min(busyAll, int(el.Seconds()*scaleBusyRate))
		dueQuiet := min(quietAll, int(el.Seconds()*scaleQuietRate))
		var bu, qu int64
		add := func(cus, i int) int64 {
			e := meterEvent(cus, i, at.UTC())
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"payload": e.Payload()}})
			totals[e.StripeCustomerID] += e.Value
			seen[tuple{cus, at.Unix()}] = struct{}{}
			return e.Value
		}
		n := 0
		for ; busyN < dueBusy; busyN++ {
			bu += add(0, busyN)
			n++
		}
		for ; quietN < dueQuiet; quietN++ {
			qu += add(1+quietN%scaleQuiet, quietN/scaleQuiet)
			n++
		}
		if n == 0 {
			continue
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
		st.slowest = max(st.slowest, time.Since(at))
		r.mu.Lock()
		r.busy.add(at, bu)
		r.quiet.add(at, qu)
		r.produced += n
		r.last = time.Now()
		r.mu.Unlock()
	}
	r.mu.Lock()
	r.producing = false
	st.rate = float64(r.produced) / r.last.Sub(start).Seconds()
	r.mu.Unlock()
	return totals, len(seen), st
}

// sample compares what the emulator counted with what was produced until
// everything is counted or scaleCap has passed since the last event.
// mark reads the group's ingest watermark.
func (r *scaleRun) sample(ctx context.Context, sim *stripesim.Server, pools []*pgxpool.Pool, done chan<- struct{},
	mark func() (time.Time, error)) {
	defer close(done)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	var qu int64
	for k := 0; ; k++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		bu := sim.MeterTotal(meterName, "cus_0")
		if k%10 == 0 {
			qu = 0
			for _, e := range sim.MeterEvents(meterName, "") {
				if e.Customer != "cus_0" {
					qu += e.Value
				}
			}
		}
		var conns int32
		for _, p := range pools {
			conns += p.Stat().TotalConns()
		}
		m, err := mark()
		now := time.Now()
		r.mu.Lock()
		r.conns = max(r.conns, conns)
		if len(r.busy.at) == 0 {
			r.mu.Unlock()
			continue
		}
		if err == nil && r.producing && !m.Before(r.busy.at[0]) {
			r.markLags = append(r.markLags, now.Sub(m))
		}
		bl, ql := r.busy.lag(bu, now), r.quiet.lag(qu, now)
		r.busyLags = append(r.busyLags, bl)
		if now.Sub(r.busy.at[0]) <= scaleStart {
			r.busyStartMax = max(r.busyStartMax, bl)
		}
		if k%10 == 0 {
			r.quietLags = append(r.quietLags, ql)
		}
		end := !r.producing && (bl == 0 && ql == 0 && k%10 == 0 || now.Sub(r.last) > scaleCap)
		r.mu.Unlock()
		if end {
			return
		}
	}
}

// percentile is the q-quantile of ds (q 1: the largest), 0 if none.
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

type ingestFigures struct {
	rows                   int64
	span, rate             float64 // seconds from the first row written to the last; rows per second over it
	lagP50, lagP99, lagMax float64 // seconds from an entry's XADD to its row
}

// ingestStats reads the ledger's rows: when each was written (created_at)
// against when its stream entry was added (its id's milliseconds).
func ingestStats(ctx context.Context, b *testing.B, pool *pgxpool.Pool) ingestFigures {
	var f ingestFigures
	err := pool.QueryRow(ctx, `SELECT count(*),
			coalesce(extract(epoch FROM max(created_at) - min(created_at)), 0)::float8,
			coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY lag), 0),
			coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY lag), 0),
			coalesce(max(lag), 0)
		FROM (SELECT created_at,
			(extract(epoch FROM created_at) * 1000 - split_part(stream_message_id, '-', 1)::bigint)::float8 / 1000 AS lag
			FROM meter_events) x`).Scan(&f.rows, &f.span, &f.lagP50, &f.lagP99, &f.lagMax)
	if err != nil {
		b.Fatal(fmt.Errorf("reading the ledger's rows: %w", err))
	}
	if f.span > 0 {
		f.rate = float64(f.rows) / f.span
	}
	return f
}

type aggregateFigures struct{ total, buckets, late, splits int64 }

// aggregateStats counts the aggregates: a bucket (customer, meter,
// second, arrival second) formed more than once was joined late; a second
// sent as more than one bucket was split by its entries' arrival.
func aggregateStats(ctx context.Context, b *testing.B, pool *pgxpool.Pool) aggregateFigures {
	var f aggregateFigures
	var seconds int64
	err := pool.QueryRow(ctx, `SELECT count(*),
			count(DISTINCT (stripe_customer_id, event_name, second, arrival_second)),
			count(DISTINCT (stripe_customer_id, event_name, second))
		FROM meter_aggregates`).Scan(&f.total, &f.buckets, &seconds)
	if err != nil {
		b.Fatal(fmt.Errorf("reading the aggregates: %w", err))
	}
	f.late, f.splits = f.total-f.buckets, f.buckets-seconds
	return f
}

// serverFigures are the Postgres server's counters a run is read against.
type serverFigures struct {
	checkpoints int64   // started, timed or requested, since the earlier reading
	walLSN      string  // the WAL's insert position
	walBytes    float64 // the WAL written since the earlier reading
}

// readServer reads the server's checkpoints (pg_stat_checkpointer from
// Postgres 17, pg_stat_bgwriter before) and its WAL, since earlier (the
// zero value: since the server began).
func readServer(ctx context.Context, b *testing.B, pool *pgxpool.Pool, earlier serverFigures) serverFigures {
	var f serverFigures
	err := pool.QueryRow(ctx, `SELECT num_timed + num_requested FROM pg_stat_checkpointer`).Scan(&f.checkpoints)
	if err != nil {
		err = pool.QueryRow(ctx, `SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter`).Scan(&f.checkpoints)
	}
	if err != nil {
		b.Fatal(fmt.Errorf("reading the server's checkpoints: %w", err))
	}
	f.checkpoints -= earlier.checkpoints
	if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text, pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8`,
		cmp.Or(earlier.walLSN, "0/0")).Scan(&f.walLSN, &f.walBytes); err != nil {
		b.Fatal(fmt.Errorf("reading the server's WAL position: %w", err))
	}
	return f
}
