package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

const deployDir = "../../../deploy"

// dashboardMetrics returns every metric name the Grafana dashboard's
// queries use.
func dashboardMetrics(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(deployDir, "grafana", "pelguard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Targets []struct{ Expr string } `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard is not JSON: %v", err)
	}
	name := regexp.MustCompile(`\b(?:pelguard|process|go)_[a-z0-9_]+`)
	var out []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for _, m := range name.FindAllString(tg.Expr, -1) {
				if !slices.Contains(out, m) {
					out = append(out, m)
				}
			}
		}
	}
	if len(out) < 10 {
		t.Fatalf("dashboard names only %v", out)
	}
	return out
}

// ruleMetrics are the metrics the rule files of deploy/prometheus
// (pelguard-rules.yaml, pelguard-webhook-rules.yaml) name.
func ruleMetrics(t *testing.T) []string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(deployDir, "prometheus", "*-rules.yaml"))
	if len(files) < 2 {
		t.Fatalf("rule files: %v", files)
	}
	var out []string
	expr := regexp.MustCompile(`(?m)^\s*expr:((?: \|\n(?:\s{10,}.*\n)+)|.*)`)
	name := regexp.MustCompile(`\bpelguard_[a-z0-9_]+`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range expr.FindAllStringSubmatch(string(b), -1) {
			for _, m := range name.FindAllString(e[1], -1) {
				if !slices.Contains(out, m) {
					out = append(out, m)
				}
			}
		}
	}
	if len(out) < 6 {
		t.Fatalf("alert rules name only %v", out)
	}
	return out
}

// Every metric the dashboard and the alert rules name is exported by the
// binary its prefix names (pelguard_alerts_* and process_* by all three),
// scraped from real processes after they did some work; /healthz and
// /readyz answer.
func TestDashboardMetricsExist(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sim := stripesim.MustNew(stripesim.Config{})
	t.Cleanup(sim.Close)
	_, dbURL := testenv.DBWithURL(t)
	rdb := testenv.Redis(t)
	stream := testenv.Name(t, "billing")
	testenv.CleanupKeys(t, rdb, stream, stream+":dead")
	env := baseEnv("DATABASE_URL="+dbURL, "REDIS_URL="+testenv.RedisURL(), "STRIPE_API_KEY="+testKey,
		"STRIPE_API_BASE="+sim.URL(), "PELGUARD_STREAM="+stream)

	if err := rdb.XGroupCreateMkStream(ctx, stream, "billing-group", "0").Err(); err != nil {
		t.Fatal(err)
	}
	add := func(p string) {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"payload": p}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// The consumer charges one event and dead-letters one.
	add(event.Event{CustomerID: "c_1", StripeCustomerID: "cus_1", AmountCents: 100, BillingPeriod: "2026-11", Currency: "usd"}.Payload())
	add(`not json`)
	cons := startBin(t, "consumer", env, "--metrics-addr", "127.0.0.1:0", "--block", "100ms")

	// A meter consumer sending from the ledger, for its unsent-backlog
	// gauges (pelguard_consumer_meter_unsent_*): four events of one
	// customer, Stripe answering each in 8 s (one call at a time per
	// customer and meter), so the last stays queued past the consumer's
	// second backlog read (consumer.BacklogEvery). It runs beside the rest.
	usage := testenv.Name(t, "usage")
	testenv.CleanupKeys(t, rdb, usage, usage+":dead")
	if _, err := sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: "api_calls", Formula: stripesim.FormulaCount}); err != nil {
		t.Fatal(err)
	}
	if err := sim.SetFaults(stripesim.Faults{MeterEventLatency: 8 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XGroupCreateMkStream(ctx, usage, "meters", "0").Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		e := event.MeterEvent{EventName: "api_calls", StripeCustomerID: "cus_busy", Value: 1, Timestamp: time.Now().UTC(), EventID: fmt.Sprintf("call-%d", i)}
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: usage, Values: map[string]any{"payload": e.Payload()}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	meter := startBin(t, "consumer", env, "meter-events", "--stream", usage, "--group", "meters", "--send-from-ledger",
		"--metrics-addr", "127.0.0.1:0", "--block", "100ms")
	maddr := meter.addr()

	testenv.Eventually(t, 30*time.Second, func() bool {
		n, _ := rdb.XLen(ctx, stream+":dead").Result()
		return sim.SucceededCharges("c_1", "2026-11") == 1 && n == 1
	}, "consumer did its work: %s", cons.out)
	cons.stop()

	// A dead consumer leaves one entry pending; the reaper re-drives it.
	add(event.Event{CustomerID: "c_2", StripeCustomerID: "cus_2", AmountCents: 100, BillingPeriod: "2026-11", Currency: "usd"}.Payload())
	if err := consumer.Register(ctx, rdb, stream, "billing-group", "dead", time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing-group", Consumer: "dead", Streams: []string{stream, ">"}, Count: 1}).Result(); err != nil {
		t.Fatal(err)
	}
	reap := startBin(t, "reaper", env, "--metrics-addr", "127.0.0.1:0", "--min-idle", "50ms", "--interval", "200ms")
	raddr := reap.addr()
	testenv.Eventually(t, 30*time.Second, func() bool { return sim.SucceededCharges("c_2", "2026-11") == 1 }, "reaper re-drove")

	aud := startBin(t, "auditor", env, "--schedule", "@every 1s", "--metrics-addr", "127.0.0.1:0", "--settle-delay", "1ms")
	aaddr := aud.addr()
	testenv.Eventually(t, 30*time.Second, func() bool {
		_, body := get(t, "http://"+aaddr+"/metrics")
		return strings.Contains(body, `pelguard_auditor_runs_total{result="clean"} 1`) || strings.Contains(body, `pelguard_auditor_runs_total{result="findings"} 1`)
	}, "an audit run finished")

	scrape := map[string]string{}
	for bin, a := range map[string]string{"reaper": raddr, "auditor": aaddr} {
		for _, path := range []string{"/healthz", "/readyz"} {
			if code, body := get(t, "http://"+a+path); code != 200 {
				t.Errorf("%s %s: %d %s", bin, path, code, body)
			}
		}
		_, scrape[bin] = get(t, "http://"+a+"/metrics")
	}
	// The reaper's 50ms --min-idle would race a live consumer: stop it.
	reap.stop()
	// A second consumer, scraped while it runs, after it did its work.
	cons2 := startBin(t, "consumer", env, "--metrics-addr", "127.0.0.1:0", "--block", "100ms")
	c2 := cons2.addr()
	// /healthz answers as soon as the server does (also while the consumer
	// waits for Redis and Postgres); /readyz once the consumer has started.
	if code, body := get(t, "http://"+c2+"/healthz"); code != 200 {
		t.Errorf("consumer /healthz: %d %s", code, body)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { code, _ := get(t, "http://"+c2+"/readyz"); return code == 200 },
		"consumer /readyz answers 200 once started")
	add(event.Event{CustomerID: "c_3", StripeCustomerID: "cus_3", AmountCents: 100, BillingPeriod: "2026-11", Currency: "usd"}.Payload())
	add(`{"still":"bad"}`)
	testenv.Eventually(t, 30*time.Second, func() bool {
		_, scrape["consumer"] = get(t, "http://"+c2+"/metrics")
		return strings.Contains(scrape["consumer"], `pelguard_consumer_events_total{outcome="charged",stream="`+stream+`"} 1`) &&
			strings.Contains(scrape["consumer"], `pelguard_consumer_events_total{outcome="dead_letter",stream="`+stream+`"} 1`)
	}, "consumer did its work again")

	// The optional Stripe webhook receiver (pelguard-consumer webhook),
	// scraped on its own ops listener: it needs Postgres and the signing
	// secret, no Stripe key and no Redis.
	hook := startBin(t, "consumer", append(baseEnv("DATABASE_URL="+dbURL), "PELGUARD_STRIPE_WEBHOOK_SECRET="+webhookSecret),
		"webhook", "--listen", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0")
	haddr := hook.addr()
	testenv.Eventually(t, 30*time.Second, func() bool { code, _ := get(t, "http://"+haddr+"/readyz"); return code == 200 },
		"the webhook receiver is ready")
	_, scrape["webhook"] = get(t, "http://"+haddr+"/metrics")

	var meterScrape string
	testenv.Eventually(t, 60*time.Second, func() bool {
		_, meterScrape = get(t, "http://"+maddr+"/metrics")
		return hasSeries(meterScrape, "pelguard_consumer_meter_unsent_oldest_seconds")
	}, "the meter consumer published its unsent backlog:\n%s", grepLines(meterScrape, "pelguard_consumer_meter"))
	for _, m := range append(dashboardMetrics(t), ruleMetrics(t)...) {
		if strings.HasPrefix(m, "pelguard_consumer_meter_unsent_") { // meter-events --send-from-ledger only
			if !hasSeries(meterScrape, m) {
				t.Errorf("metric %s (dashboard or alert rules) is not on the meter consumer's /metrics:\n%s", m, grepLines(meterScrape, "pelguard_consumer_meter"))
			}
			continue
		}
		if strings.HasPrefix(m, "pelguard_webhook_") {
			if !hasSeries(scrape["webhook"], m) {
				t.Errorf("metric %s (dashboard or alert rules) is not on the webhook receiver's /metrics:\n%s", m, grepLines(scrape["webhook"], "pelguard_webhook"))
			}
			continue
		}
		owners := []string{"consumer", "reaper", "auditor"}
		if strings.HasPrefix(m, "pelguard_stream_") { // the pause watcher's: the roles that bill
			owners = []string{"consumer", "reaper"}
		}
		for _, b := range owners {
			if strings.HasPrefix(m, "pelguard_"+b+"_") {
				owners = []string{b}
			}
		}
		for _, b := range owners {
			if !hasSeries(scrape[b], m) {
				t.Errorf("metric %s (dashboard or alert rules) is not on the %s's /metrics:\n%s", m, b, grepLines(scrape[b], "pelguard_consumer"))
			}
		}
	}
	// Same naming on every binary: pelguard_<binary>_, pelguard_alerts_,
	// pelguard_ledger_ (the ledger's replication mode, which every role
	// reports) or pelguard_build_info (the reaper re-drives through the
	// consumer's code and exports its series as well).
	// pelguard_redis_primary_changes_total is the shared Redis opener's, in
	// every role that reaches Redis, as alerts and ledger are.
	// pelguard_stream_paused is the pause watcher's, in every role that
	// bills from a stream.
	allowed := map[string][]string{"consumer": {"consumer", "alerts", "ledger", "redis", "build", "stream"},
		"reaper":  {"reaper", "consumer", "alerts", "ledger", "redis", "build", "stream"},
		"auditor": {"auditor", "alerts", "ledger", "redis", "build"}, "webhook": {"webhook", "alerts", "ledger", "redis", "build"}}
	// Every binary says which build it is, in its role.
	buildInfo := regexp.MustCompile(`(?m)^pelguard_build_info\{goversion="go[^"]+",revision="[^"]+",role="([a-z]+)",version="[^"]+"\} 1$`)
	for bin, body := range scrape {
		if m := buildInfo.FindStringSubmatch(body); m == nil || m[1] != bin {
			t.Errorf("%s: pelguard_build_info with role=%q missing or wrong: %v\n%s", bin, bin, m, grepLines(body, "build_info"))
		}
	}
	series := regexp.MustCompile(`(?m)^(pelguard_[a-z]+)_`)
	for bin, body := range scrape {
		for _, m := range series.FindAllStringSubmatch(body, -1) {
			if !slices.Contains(allowed[bin], strings.TrimPrefix(m[1], "pelguard_")) {
				t.Errorf("%s exports %s…", bin, m[1])
			}
		}
	}
}

func hasSeries(body, name string) bool {
	for line := range strings.SplitSeq(body, "\n") {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			return true
		}
	}
	return false
}

func grepLines(body, substr string) string {
	var out []string
	for line := range strings.SplitSeq(body, "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
