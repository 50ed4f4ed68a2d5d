package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/reaper"
)

// promAnswer is the vector fakePrometheus answers to queries containing
// Frag: value by role.
type promAnswer struct {
	Frag  string
	Roles map[string]string
}

// fakePrometheus answers the instant queries the overview sends as
// Prometheus's HTTP API does: the first answer whose fragment the query
// contains, one series per role.
func fakePrometheus(t *testing.T, answers []promAnswer) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query().Get("query")
		var result []map[string]any
		if strings.HasSuffix(r.URL.Path, "/query_range") {
			// The value of the query's fragment with the role "", at the end of the range.
			for _, a := range answers {
				if v, ok := a.Roles[""]; ok && strings.Contains(q, a.Frag) {
					end, _ := strconv.ParseFloat(r.URL.Query().Get("end"), 64)
					result = append(result, map[string]any{"metric": map[string]string{}, "values": [][]any{{end, v}}})
					break
				}
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": map[string]any{"resultType": "matrix", "result": result}})
			return
		}
		for _, a := range answers {
			if strings.Contains(q, a.Frag) {
				for role, v := range a.Roles {
					result = append(result, map[string]any{"metric": map[string]string{"role": role}, "value": []any{1.0, v}})
				}
				break
			}
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": map[string]any{"resultType": "vector", "result": result}})
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestOverviewShowsLivePipeline: a running consumer is counted and listed
// with its heartbeat and the events it handled (not "CONSUMERS 0" because
// it holds nothing), beside the PEL's live and dead owners; the reaper's
// pass, the auditor's run, the last webhook and the limiter's figures by
// role are shown, and the chart counts the charges the consumer made.
func TestOverviewShowsLivePipeline(t *testing.T) {
	t.Parallel()
	prom := fakePrometheus(t, []promAnswer{
		{`sum(increase(pelguard_stripe_limiter_requests_total{result="delayed"}`, map[string]string{"": "240"}},
		{`sum(increase(pelguard_stripe_limiter_rate_limited_total`, map[string]string{"": "7"}},
		{`result="delayed"`, map[string]string{"billing": "1.5"}},
		{"rate_limited", map[string]string{"billing": "3"}},
		{"wait_seconds", map[string]string{"billing": "0.25", "audit": "NaN"}},
		{"fallback_requests", map[string]string{"billing": "0"}},
		{"requests_total", map[string]string{"billing": "42.5", "audit": "0.4"}},
	})
	b := setup(t, func(c *Config) { c.Reaper.MinIdle = time.Millisecond; c.PrometheusURL = prom.URL })
	b.seedPEL(t)
	ctx := context.Background()
	testenv.CleanupKeys(t, b.rdb, consumer.StatsKey(b.stream, b.group, "consumer-running"))

	// A pelguard consumer bills three events and keeps running, holding nothing.
	const n = 3
	for i := range n {
		e := event.Event{CustomerID: fmt.Sprintf("run%d", i), StripeCustomerID: fmt.Sprintf("cus_run%d", i), AmountCents: 1200,
			BillingPeriod: testPeriod, Currency: "usd"}
		if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: map[string]any{event.PayloadField: e.Payload()}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	c, err := consumer.New(consumer.Config{Redis: b.rdb, DB: b.cfg.DB, Schema: b.cfg.Schema, Stripe: b.cfg.Stripe, Stream: b.stream,
		Group: b.group, Name: "consumer-running", Namespace: testNS, Block: 50 * time.Millisecond, Lease: 900 * time.Millisecond,
		Logger: testenv.Logger(t), Clock: b.clk})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	testenv.Eventually(t, 10*time.Second, func() bool {
		st, err := consumer.ReadStats(ctx, b.rdb, b.stream, b.group, []string{"consumer-running"})
		return err == nil && st["consumer-running"].Events == n
	}, "the consumer publishes %d events handled", n)
	if got := b.sim.Requests()["POST /v1/charges"] + b.sim.Requests()["POST /v1/payment_intents"]; got != n {
		t.Fatalf("%d charges made, want %d", got, n)
	}

	r, err := reaper.New(reaper.Config{Redis: b.rdb, DB: b.cfg.DB, Schema: b.cfg.Schema, DryRun: true, MinIdle: time.Hour,
		Name: "reaper-under-test", Streams: []reaper.StreamGroup{{Stream: b.stream, Group: b.group}}, Clock: b.clk, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.auditor.Run(ctx, audit.Window{From: w0, To: w1}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO {schema}.webhook_events (event_id, type, object_id, received_at, result)
		VALUES ('evt_1', 'charge.succeeded', 'ch_x', now(), 'settled')`); err != nil {
		t.Fatal(err)
	}

	page := b.login(t, "alice").mustGet("/")
	members := regexp.MustCompile(`<td class="n">(\d+) <span class="muted small">\((\d+) holding\)`).FindStringSubmatch(page)
	if members == nil || members[1] != "4" || members[2] != "3" {
		t.Errorf("streams table: want 4 consumers (3 holding), got %v", members)
	}
	row := regexp.MustCompile(`(?s)<tr id="consumer-consumer-running"[^>]*>(.*?)</tr>`).FindStringSubmatch(page)
	if row == nil {
		t.Fatalf("the running consumer is not listed:\n%s", page)
	}
	cells := regexp.MustCompile(`(?s)<td[^>]*>(.*?)</td>`).FindAllStringSubmatch(row[1], -1)
	cell := func(i int) string {
		return strings.TrimSpace(regexp.MustCompile(`<[^>]+>`).ReplaceAllString(cells[i][1], ""))
	}
	if cell(2) != "live, heartbeat 0s ago" || cell(3) != "0" || cell(5) != fmt.Sprint(n) {
		t.Errorf("running consumer: state %q, held %q, events %q; want live, heartbeat 0s ago, 0, %d", cell(2), cell(3), cell(5), n)
	}
	for _, want := range []string{
		`id="consumer-consumer-dead"`, "silent 1.0h", "never registered", // the PEL's owners
		"reaper-under-test", "dry run", // the pass log
		"charge.succeeded", "1 in the last hour", // webhooks
		"<td>billing</td><td class=\"n\">42.50</td><td class=\"n\">1.50</td><td class=\"n\">0.250s</td>", // the limiter
		`<td class="n error">3</td>`,                    // 429s in the last hour
		`429s 7 <span class="key k1"></span>waited 240`, // the limiter's chart, from a range query
		`<meta http-equiv="refresh" content="15">`,
		`<svg class="chart"`, "charged " + fmt.Sprint(n+1), // the consumer's three and the seeded one
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the overview does not show %q", want)
		}
	}
	if runs := regexp.MustCompile(`<tr><td data-label="run">#\d+ <span class="st st-ok">ok</span>`).FindAllString(page, -1); len(runs) != 1 {
		t.Errorf("want the auditor's one run listed, got %d", len(runs))
	}
}
