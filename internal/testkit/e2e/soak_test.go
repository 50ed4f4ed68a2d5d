package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// The soak (`make soak`, never in CI): the fleet as separate processes —
// two consumers, a meter consumer, the reaper trimming both streams, the
// auditor on a schedule — against real Redis and Postgres and the Stripe
// emulator limiting at the account's rate with its faults (500s, 429s,
// latency with a slow tail, one declining customer), events produced at a
// steady rate for SOAK_DURATION (30m). Retention is scaled to minutes
// (SOAK_RETENTION, 2m): the binaries are built with -tags pelguard_soak,
// whose reaper accepts it. Every SOAK_SAMPLE (1m) it records Redis
// used_memory, each stream's XLEN, each pelguard table's size, each
// process's RSS and goroutines (samples.csv, summary.json in SOAK_OUT),
// then reports each series' least-squares slope after the first retention
// cycles. It fails on a duplicate charge or meter event, on any produced
// event neither billed/counted nor dead-lettered with a reason, and on a
// stream that keeps growing.
func TestSoak(t *testing.T) {
	if !soakBuild {
		t.Skip("the soak runs for minutes with binaries built for it: run `make soak` (SOAK_DURATION=5m make soak for a short one)")
	}
	p := soakParams(t)
	ctx := context.Background()
	sim, err := stripesim.New(stripesim.Config{Seed: 39, Faults: stripesim.Faults{
		RateLimit: p.stripeRate, RateBurst: int(p.stripeRate),
		ErrorRate: 0.02, RateLimitedRate: 0.01,
		Latency:          stripesim.Latency{Min: 20 * time.Millisecond, Max: 150 * time.Millisecond, TailProb: 0.01, Tail: 2 * time.Second},
		DeclineCustomers: []string{declining},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	if _, err := sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: soakMeter}); err != nil {
		t.Fatal(err)
	}
	admin, dbURL := testenv.DBWithURL(t)
	schema := testenv.SchemaOf(admin)
	rdb := testenv.Redis(t)
	charges, meters := testenv.Name(t, "soak-billing"), testenv.Name(t, "soak-usage")
	const group, meterGroup = "billing-group", "meter-group"
	testenv.CleanupKeys(t, rdb, charges, meters, consumer.DeadLetterStream(charges), consumer.DeadLetterStream(meters))
	for s, g := range map[string]string{charges: group, meters: meterGroup} {
		if err := consumer.EnsureGroup(ctx, rdb, s, g); err != nil {
			t.Fatal(err)
		}
	}
	account := "soak-" + testenv.Suffix()
	env := baseEnv("DATABASE_URL="+dbURL, "REDIS_URL="+testenv.RedisURL(), "STRIPE_API_KEY="+testKey, "STRIPE_API_BASE="+sim.URL())
	stripe := []string{"--stripe-rate", fmt.Sprint(p.stripeRate), "--stripe-account", account, "--metrics-addr", "127.0.0.1:0"}
	fleet := []*proc{
		named(startBin(t, "consumer", env, append([]string{"--stream", charges, "--group", group, "--block", "100ms"}, stripe...)...), "consumer-1"),
		named(startBin(t, "consumer", env, append([]string{"--stream", charges, "--group", group, "--block", "100ms"}, stripe...)...), "consumer-2"),
		named(startBin(t, "consumer", env, append([]string{"meter-events", "--stream", meters, "--group", meterGroup, "--block", "100ms"}, stripe...)...), "meter-consumer"),
		named(startBin(t, "reaper", env, append([]string{"--stream", charges, "--group", group, "--meter-stream", meters + "=" + meterGroup,
			"--interval", "5s", "--stream-retention", p.retention.String()}, stripe...)...), "reaper"),
		named(startBin(t, "auditor", env, append([]string{"--schedule", "@every 1m", "--settle-delay", "1ms"}, stripe...)...), "auditor"),
	}
	addrs := map[string]string{}
	for _, pr := range fleet {
		addrs[pr.name] = pr.addr()
	}

	s := &sampler{t: t, rdb: rdb, admin: admin, schema: schema, streams: []string{charges, meters,
		consumer.DeadLetterStream(charges), consumer.DeadLetterStream(meters)}, procs: fleet, addrs: addrs, start: time.Now(), load0: loadAvg()}
	s.sample(ctx) // minute 0
	prodCtx, stopProducing := context.WithTimeout(ctx, p.duration)
	defer stopProducing()
	var wg sync.WaitGroup
	var prod produced
	wg.Add(2)
	go func() { defer wg.Done(); prod.run(prodCtx, t, rdb, charges, meters, p.rate) }()
	go func() {
		// Samples at whole multiples of SOAK_SAMPLE, the last as production ends.
		defer wg.Done()
		for k := 1; time.Duration(k)*p.sample <= p.duration; k++ {
			time.Sleep(time.Until(s.start.Add(time.Duration(k) * p.sample)))
			s.sample(ctx)
		}
	}()
	wg.Wait()
	t.Logf("produced %d charge events and %d meter events in %s", len(prod.charges), len(prod.meters), p.duration)

	// Drain: every charge event in the ledger or dead-lettered, every meter
	// event at the emulator or dead-lettered, nothing pending.
	testenv.Eventually(t, 10*time.Minute, func() bool {
		return ledgerRows(t, admin, schema)+xlen(t, rdb, consumer.DeadLetterStream(charges)) >= int64(len(prod.charges)) &&
			int64(len(sim.MeterEvents(soakMeter, "")))+xlen(t, rdb, consumer.DeadLetterStream(meters)) >= int64(len(prod.meters)) &&
			pendingOf(t, rdb, charges, group) == 0 && pendingOf(t, rdb, meters, meterGroup) == 0
	}, "the fleet drained what was produced")
	for _, pr := range fleet {
		pr.stop()
	}

	res := s.report(p)
	res.Produced = map[string]int{"charge_events": len(prod.charges), "meter_events": len(prod.meters)}
	res.Money = checkNothingLostOrDoubled(t, sim, admin, schema, rdb, charges, meters, &prod)
	s.write(t, p, res)
	// A stream that grows by a tenth of what is produced each minute is not
	// being trimmed (without trimming its slope is the whole rate).
	for _, name := range []string{charges, meters} {
		if sl, ok := res.Slopes["xlen:"+name]; ok && sl.Points >= 3 && sl.PerMinute > 0.1*p.rate*60 {
			t.Errorf("XLEN %s grows %.0f entries a minute after the first retention cycles (produced %.0f a minute): not trimmed", name, sl.PerMinute, p.rate*60)
		}
	}
	for _, pr := range fleet {
		// Goroutines move with the work in flight (an audit run, a batch):
		// a leak is a steady climb over several samples, not one busy sample.
		if sl, ok := res.Slopes["goroutines:"+pr.name]; ok && sl.Points >= 5 && sl.PerMinute > 10 && sl.Last-sl.First > 30 {
			t.Errorf("%s: goroutines grow %.1f a minute after the first retention cycles: a leak", pr.name, sl.PerMinute)
		}
	}
}

const (
	soakMeter = "soak_api_calls"
	declining = "cus_soak_declines" // the emulator declines this customer's charges
)

type params struct {
	duration, retention, sample time.Duration
	rate, stripeRate            float64 // events/s per stream; the account's requests/s
	out                         string
}

func soakParams(t *testing.T) params {
	t.Helper()
	p := params{duration: 30 * time.Minute, retention: 2 * time.Minute, sample: time.Minute, rate: 5, stripeRate: 20,
		out: os.Getenv("SOAK_OUT")}
	for name, d := range map[string]*time.Duration{"SOAK_DURATION": &p.duration, "SOAK_RETENTION": &p.retention, "SOAK_SAMPLE": &p.sample} {
		if v := os.Getenv(name); v != "" {
			x, err := time.ParseDuration(v)
			if err != nil || x <= 0 {
				t.Fatalf("%s=%q: give a positive duration such as 5m", name, v)
			}
			*d = x
		}
	}
	for name, f := range map[string]*float64{"SOAK_RATE": &p.rate, "SOAK_STRIPE_RATE": &p.stripeRate} {
		if v := os.Getenv(name); v != "" {
			if _, err := fmt.Sscan(v, f); err != nil || *f <= 0 {
				t.Fatalf("%s=%q: give a positive number", name, v)
			}
		}
	}
	if p.out == "" {
		p.out = t.TempDir()
	}
	if err := os.MkdirAll(p.out, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func named(p *proc, name string) *proc { p.name = name; return p }

// produced is what the producer put on the streams, to account for at the end.
type produced struct {
	mu      sync.Mutex
	charges []soakCharge
	meters  []event.MeterEvent
}

type soakCharge struct {
	customer string
	kind     string // "bill", "decline" (the emulator declines it), "bad" (not JSON: dead-lettered)
	payload  string
}

// run adds rate charge events and rate meter events a second until ctx
// ends. One in 97 charges is for the declining customer, one in 499 is
// not JSON.
func (pr *produced) run(ctx context.Context, t *testing.T, rdb *redis.Client, charges, meters string, rate float64) {
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		c := soakCharge{customer: fmt.Sprintf("c_%d", i), kind: "bill"}
		e := event.Event{CustomerID: c.customer, StripeCustomerID: "cus_" + c.customer[2:], AmountCents: int64(100 + i%900),
			BillingPeriod: "2026-11", Currency: "usd"}
		switch {
		case i%499 == 498:
			c.kind, c.payload = "bad", fmt.Sprintf("not json %d", i)
		case i%97 == 96:
			c.kind, e.StripeCustomerID = "decline", declining
		}
		if c.payload == "" {
			c.payload = e.Payload()
		}
		m := event.MeterEvent{EventName: soakMeter, StripeCustomerID: fmt.Sprintf("cus_m%d", i%200), Value: 1,
			Timestamp: time.Now().UTC(), EventID: fmt.Sprintf("m%d", i)}
		pipe := rdb.Pipeline()
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: charges, Values: map[string]any{"payload": c.payload}})
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: meters, Values: map[string]any{"payload": m.Payload()}})
		if _, err := pipe.Exec(ctx); err != nil {
			if ctx.Err() != nil {
				return // cut at the deadline: not added
			}
			t.Errorf("producing: %v", err)
			return
		}
		pr.mu.Lock()
		pr.charges = append(pr.charges, c)
		pr.meters = append(pr.meters, m)
		pr.mu.Unlock()
	}
}

func xlen(t *testing.T, rdb *redis.Client, stream string) int64 {
	n, err := rdb.XLen(context.Background(), stream).Result()
	if err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	return n
}

func pendingOf(t *testing.T, rdb *redis.Client, stream, group string) int64 {
	p, err := rdb.XPending(context.Background(), stream, group).Result()
	if err != nil {
		t.Fatal(err)
	}
	return p.Count
}

// ledgerRows counts the ledger's rows: one per charge event decided
// (charged, declined, failed) — every event here has its own customer.
func ledgerRows(t *testing.T, admin *pgxpool.Pool, schema string) int64 {
	t.Helper()
	var n int64
	if err := admin.QueryRow(context.Background(), "SELECT count(*) FROM "+schema+".billing_records WHERE status <> 'pending'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// deadReasons reads a dead-letter stream: payload → reason.
func deadReasons(t *testing.T, rdb *redis.Client, stream string) map[string]string {
	t.Helper()
	out := map[string]string{}
	msgs, err := rdb.XRange(context.Background(), stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		p, _ := m.Values["payload"].(string)
		r, _ := m.Values["reason"].(string)
		out[p] = strings.TrimSpace(r)
	}
	return out
}
