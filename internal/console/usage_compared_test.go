package console

import (
	"context"
	"fmt"
	"html"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

// meterWorld delivers meter events as the meter consumer does (reserved
// in the ledger, sent to the emulator under their identifier, finished
// delivered) and reconciles them with a real auditor.
type meterWorld struct {
	*bundle
	t      *testing.T
	meters *meterledger.Ledger
	usage  *audit.Auditor
	seq    int
}

func setupMeters(t *testing.T, mod func(*Config)) *meterWorld {
	t.Helper()
	b := setup(t, mod)
	ml, err := meterledger.New(b.cfg.DB, meterledger.Config{Schema: b.cfg.Schema, Clock: b.clk})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ml.EnsurePartitions(context.Background(), b.clk.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: "api_requests"}); err != nil {
		t.Fatal(err)
	}
	a, err := audit.New(audit.Config{DB: b.cfg.DB, Schema: b.cfg.Schema, Clock: b.clk, Logger: testenv.Logger(t), Notifier: b.mem,
		Stripe: stripeapi.Config{APIKey: testKey, BaseURL: b.sim.URL(), MaxNetworkRetries: -1},
		Usage:  audit.UsageConfig{SettleDelay: 10 * time.Minute, StableChecks: 2}})
	if err != nil {
		t.Fatal(err)
	}
	return &meterWorld{bundle: b, t: t, meters: ml, usage: a}
}

// deliver records one event of cust delivered (and sent to the emulator).
func (w *meterWorld) deliver(cust string, value int64, ts time.Time) string {
	w.t.Helper()
	ctx := context.Background()
	w.seq++
	ev := event.MeterEvent{EventName: "api_requests", StripeCustomerID: cust, Value: value, Timestamp: ts, EventID: fmt.Sprintf("e%d", w.seq)}
	id := ev.Identifier(testNS)
	cl, err := w.meters.Reserve(ctx, []meterledger.Request{{Event: ev, Identifier: id, Owner: "test", Lease: time.Minute, MessageID: fmt.Sprintf("1-%d", w.seq)}})
	if err != nil || !cl[0].Decision.MaySend() {
		w.t.Fatalf("reserving %s: %v %+v", id, err, cl)
	}
	if _, err := w.cfg.Stripe.SendMeterEvent(ctx, stripeapi.MeterEvent{EventName: ev.EventName, StripeCustomerID: cust, Value: value, Identifier: id, Timestamp: ts}); err != nil {
		w.t.Fatal(err)
	}
	if _, err := w.meters.Finish(ctx, []meterledger.Outcome{{Hold: cl[0].Hold(), Result: meterledger.Delivered}}); err != nil {
		w.t.Fatal(err)
	}
	return id
}

func (w *meterWorld) tick(d time.Duration) {
	w.clk.Advance(d)
	w.sim.Advance(d)
}

var comparedRowRe = regexp.MustCompile(`(?s)<tr id="compared-([^"]+)" data-compared="([a-z]+)">(.*?)</tr>`)

func comparedRows(page string) map[string][2]string {
	out := map[string][2]string{}
	for _, m := range comparedRowRe.FindAllStringSubmatch(page, -1) {
		out[m[1]] = [2]string{m[2], strings.Join(strings.Fields(html.UnescapeString(tagOrSpan.ReplaceAllString(m[3], " "))), " ")}
	}
	return out
}

// The Usage page claims agreement only for what a run compared: before
// any run it says nothing is compared (it said "Stripe's totals and the
// ledger agree"); per meter of a customer it says when it was last
// compared and how many delivered events are not compared yet — all of
// them before the first run, none after a run covered them, and an event
// delivered after the run again.
func TestUsagePageSaysWhatWasCompared(t *testing.T) {
	t.Parallel()
	w := setupMeters(t, nil)
	ctx := context.Background()
	c := w.login(t, "alice")
	at := now.Add(-3 * time.Hour)
	for i := range 3 {
		w.deliver("cus_A", int64(i+1), at.Add(time.Duration(i)*time.Minute))
	}
	page := c.mustGet("/usage?customer=cus_A")
	if strings.Contains(page, "the ledger agree") || !strings.Contains(page, "No usage run has finished yet: nothing is compared, and no agreement is claimed.") {
		t.Errorf("before any run the page claims agreement or does not say nothing was compared:\n%s", page)
	}
	if r := comparedRows(page)["api_requests"]; r[0] != "never" || !strings.Contains(r[1], "never compared") || !strings.Contains(r[1], "3 events, 6 units") {
		t.Errorf("before any run: %q, want never compared, 3 events (6 units) not compared", r)
	}
	if all := c.mustGet("/usage"); !strings.Contains(all, "1 of the 1 customer-meters with usage this month has never been compared.") ||
		!strings.Contains(all, `<tr data-compared="never"><td class="mono"><a href="/usage?customer=cus_A">cus_A</a>`) {
		t.Errorf("before any run, the page without a customer does not list cus_A's meter as never compared")
	}
	w.tick(15 * time.Minute) // the deliveries settle
	rep, err := w.usage.ReconcileUsage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.WindowsCompared != 1 || rep.OpenFindings != 0 || rep.Suspect != 0 {
		t.Fatalf("the run: %+v", rep)
	}
	page = c.mustGet("/usage?customer=cus_A")
	if !strings.Contains(page, fmt.Sprintf("in the windows compared (the last run, #%d", rep.RunID)) {
		t.Errorf("after the run the page does not bound its claim to the run:\n%s", page)
	}
	r := comparedRows(page)["api_requests"]
	if r[0] != "yes" || !strings.Contains(r[1], fmt.Sprintf("run #%d", rep.RunID)) || !strings.Contains(r[1], "0 0 queued 0 3") {
		t.Errorf("after the run: %q, want compared by run #%d, 0 not compared, 0 queued, 0 parked or failed, 3 events", r, rep.RunID)
	}
	if !strings.Contains(page, fmt.Sprintf("Run #%d compared 1 customer-meter.", rep.RunID)) {
		t.Error("the page does not say what the last run covered")
	}
	if all := c.mustGet("/usage"); !strings.Contains(all, "Every one of the 1 customer-meters with usage this month has been compared at least once.") ||
		!strings.Contains(all, fmt.Sprintf("run #%d, ", rep.RunID)) {
		t.Errorf("after the run, the page without a customer does not say cus_A's meter was compared")
	}
	// Delivered after the run looked: not compared yet.
	w.tick(time.Second)
	w.deliver("cus_A", 10, at.Add(10*time.Minute))
	if r := comparedRows(c.mustGet("/usage?customer=cus_A"))["api_requests"]; !strings.Contains(r[1], "1 events, 10 units") {
		t.Errorf("an event delivered after the run: %q, want 1 event (10 units) not compared yet", r)
	}
}

var meterEventTr = regexp.MustCompile(`(?s)<tr data-status="([a-z]+)">(.*?)</tr>`)
var identifierRe = regexp.MustCompile(`/meter-events\?identifier=([^&"]+)&amp;`)

// The meter-event browser answers "was this event counted?": a customer's
// events newest first, a page at a time with no event twice or missed,
// filtered by meter, status and identifier; a last error is shown
// redacted; a bad status or cursor is refused 400.
func TestMeterEventBrowser(t *testing.T) {
	t.Parallel()
	w := setupMeters(t, func(c *Config) { c.PageSize = 3 })
	ctx := context.Background()
	c := w.login(t, "alice")
	at := now.Add(-2 * time.Hour)
	ids := map[string]bool{}
	for i := range 7 {
		ids[w.deliver("cus_B", 1, at.Add(time.Duration(i)*time.Second))] = true
	}
	w.deliver("cus_other", 1, at)
	// One failed with a secret in its error, as a refusal might echo it.
	ev := event.MeterEvent{EventName: "api_requests", StripeCustomerID: "cus_B", Value: 4, Timestamp: at.Add(time.Hour), EventID: "bad"}
	cl, err := w.meters.Reserve(ctx, []meterledger.Request{{Event: ev, Identifier: ev.Identifier(testNS), Owner: "test", Lease: time.Minute, MessageID: "9-9"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.meters.Finish(ctx, []meterledger.Outcome{{Hold: cl[0].Hold(), Result: meterledger.Failed,
		Reason: "invalid_request_error: key sk_live_4eC39HqLyjWDarjtT1zdp7dc has no meter"}}); err != nil {
		t.Fatal(err)
	}

	seen := map[string]int{}
	next, pages := "/meter-events?customer=cus_B", 0
	for next != "" {
		page := c.mustGet(next)
		pages++
		rows := meterEventTr.FindAllStringSubmatch(page, -1)
		if len(rows) > 3 {
			t.Fatalf("a page of %d rows, page size 3", len(rows))
		}
		for _, m := range identifierRe.FindAllStringSubmatch(page, -1) {
			seen[m[1]]++
		}
		if strings.Contains(page, "cus_other") {
			t.Error("another customer's event is listed")
		}
		if strings.Contains(page, "sk_live_") {
			t.Error("a last error is shown with its secret")
		}
		next = ""
		if m := regexp.MustCompile(`<a href="([^"]+)" id="older">`).FindStringSubmatch(page); m != nil {
			next = html.UnescapeString(m[1])
		}
	}
	if pages != 3 || len(seen) != 8 {
		t.Fatalf("%d pages, %d events seen, want 3 pages and 8 events", pages, len(seen))
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("event %s listed %d times", id, n)
		}
	}
	failed := c.mustGet("/meter-events?customer=cus_B&status=failed")
	if rows := meterEventTr.FindAllStringSubmatch(failed, -1); len(rows) != 1 || rows[0][1] != "failed" ||
		!strings.Contains(rows[0][2], "[REDACTED] has no meter") {
		t.Errorf("status=failed: %v", rows)
	}
	var one string
	for id := range ids {
		one = id
		break
	}
	byID := c.mustGet("/meter-events?customer=cus_B&identifier=" + one)
	if rows := meterEventTr.FindAllStringSubmatch(byID, -1); len(rows) != 1 || !strings.Contains(rows[0][2], one) || rows[0][1] != "delivered" {
		t.Errorf("identifier=%s: %d rows", one, len(rows))
	}
	if rows := meterEventTr.FindAllStringSubmatch(c.mustGet("/meter-events?customer=cus_B&meter=storage_gb"), -1); len(rows) != 0 {
		t.Errorf("meter=storage_gb: %d rows", len(rows))
	}
	if r := c.get("/meter-events?identifier=" + one); r.code != http.StatusUnprocessableEntity || !strings.Contains(r.body, "Stripe customer with its identifier") {
		t.Errorf("an identifier without its customer: %d", r.code)
	}
	// On a table of many customers a customer's page, its next page and an
	// identifier within it read the customer index, not every partition.
	if _, err := w.pool.Exec(ctx, `INSERT INTO {schema}.meter_events (event_ts, identifier, event_name, stripe_customer_id, value,
			status, first_sent_at, attempts, epoch, delivered_at, created_at)
		SELECT $1::timestamptz - (g % 3600) * interval '1 second', 'pg_bulk_' || g, 'api_requests', 'cus_' || (g % 500), 1,
			'delivered', $1, 1, 1, $1, $1 FROM generate_series(1, 20000) g`, now); err != nil {
		t.Fatal(err)
	}
	if _, err := w.pool.Exec(ctx, `ANALYZE {schema}.meter_events`); err != nil {
		t.Fatal(err)
	}
	ts := now.Add(-time.Minute)
	for _, f := range []meterEventFilter{{Customer: "cus_7"}, {Customer: "cus_7", Status: "failed"}, {Customer: "cus_7", Identifier: one},
		{Customer: "cus_7", BeforeTS: &ts, BeforeID: "pg_x"}} {
		q, args := meterEventsQuery(f, 51)
		var plan strings.Builder
		rows, err := w.pool.Query(ctx, "EXPLAIN "+q, args...)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan.WriteString(line + "\n")
		}
		rows.Close()
		seq := false // a sequential scan of a partition that holds rows (an empty one costs 0); the page's aggregates are a few rows by key
		for _, line := range strings.Split(plan.String(), "\n") {
			seq = seq || strings.Contains(line, "Seq Scan on meter_events") && !strings.Contains(line, "cost=0.00..0.00")
		}
		if !strings.Contains(plan.String(), "stripe_customer_id_event_ts_idx") || seq { // the partitions' copies of meter_events_customer_idx
			t.Errorf("%+v does not read the customer index:\n%s", f, plan.String())
		}
	}
	for _, p := range []string{"/meter-events?status=lost", "/meter-events?before=x", "/meter-events?before=12.", "/meter-events?before=abc.id"} {
		if r := c.get(p); r.code != http.StatusBadRequest {
			t.Errorf("GET %s: %d, want 400", p, r.code)
		}
	}
}
