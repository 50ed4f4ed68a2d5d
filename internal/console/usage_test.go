package console

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The Usage page shows each usage finding with both totals, its difference
// and its correction (sent, or left to a person), filtered by customer and
// meter, open ones unless asked for all; texts are escaped and redacted.
func TestUsagePageShowsFindingsAndCorrections(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	c := b.login(t, "alice")
	if page := c.mustGet("/usage"); !strings.Contains(page, "No usage finding open") {
		t.Fatalf("an empty reconciliation:\n%s", page)
	}
	var run int64
	if err := b.pool.QueryRow(ctx, `INSERT INTO {schema}.usage_runs (started_at, finished_at, hourly_from, daily_from, compared_to)
		VALUES ($1, $1, $1, $1, $1) RETURNING id`, now).Scan(&run); err != nil {
		t.Fatal(err)
	}
	finding := func(cus, meter, kind, state string, start time.Time, ledgerV, stripeV int, manual string) int64 {
		t.Helper()
		var id int64
		var resolved *time.Time
		resolution := ""
		if state == "resolved" {
			resolved, resolution = &now, "the totals agree"
		}
		if err := b.pool.QueryRow(ctx, `INSERT INTO {schema}.usage_findings (event_name, meter_id, stripe_customer_id,
				window_start, window_end, kind, state, measure, ledger_value, stripe_value, checks, first_seen_run_id,
				last_seen_run_id, opened_at, resolved_at, resolution, manual_action, created_at, updated_at)
			VALUES ($1, 'mtr_1', $2, $3, $4, $5, $6, 'sum', $7, $8, 2, $9, $9, $10, $11, nullif($12, ''), nullif($13, ''), $10, $10)
			RETURNING id`, meter, cus, start, start.Add(time.Hour), kind, state, ledgerV, stripeV, run, now, resolved, resolution, manual).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	w := now.Add(-5 * time.Hour).Truncate(time.Hour)
	over := finding("cus_A", "api_requests", "usage_over", "open", w, 40, 43, "")
	finding("cus_B", "api_requests", "usage_under", "open", w.Add(-time.Hour), 10, 7, "the invoice is final: credit <b>3</b> api_requests units")
	finding("cus_A", "storage_gb", "usage_over", "resolved", w.Add(-2*time.Hour), 5, 5, "")
	if _, err := b.pool.Exec(ctx, `INSERT INTO {schema}.usage_corrections (finding_id, kind, identifier, event_name,
			stripe_customer_id, window_start, window_end, units, event_ts, status, resend_until, source, recorded_at, sent_at, events_sent)
		VALUES ($1, 'negative_event', 'pgc_1', 'api_requests', 'cus_A', $2, $3, -3, $2, 'sent', $4, 'auditor', $5, $5, 1)`,
		over, w, w.Add(time.Hour), now.Add(23*time.Hour), now); err != nil {
		t.Fatal(err)
	}
	page := c.mustGet("/usage")
	for _, want := range []string{"usage_over · open", "usage_under · open", ">40<", ">43<", ">3<", ">-3<",
		"negative_event of -3 units: <b>sent</b>", "for a person:</span> the invoice is final: credit &lt;b&gt;3&lt;/b&gt; api_requests units"} {
		if !strings.Contains(page, want) {
			t.Errorf("the usage page lacks %q", want)
		}
	}
	if strings.Contains(page, "storage_gb") {
		t.Error("a resolved finding is shown without ?state=all")
	}
	if page := c.mustGet("/usage?state=all&meter=storage_gb"); !strings.Contains(page, "usage_over · resolved") || strings.Contains(page, "cus_B") {
		t.Errorf("?state=all&meter=storage_gb:\n%s", page)
	}
	if page := c.mustGet("/usage?customer=cus_B"); !strings.Contains(page, "usage_under") || strings.Contains(page, "negative_event") {
		t.Errorf("?customer=cus_B:\n%s", page)
	}

	// Meter caps of this month with their use; another month's are not
	// shown.
	for _, q := range []string{
		`INSERT INTO {schema}.meter_caps (event_name, stripe_customer_id, month, cap, counts, updated_at) VALUES
			('api_requests', 'cus_A', '*', 100, 'units', now()), ('api_requests', '*', '*', 10, 'units', now()),
			('api_requests', '*', '2020-01', 1, 'units', now())`,
		`INSERT INTO {schema}.meter_usage (event_name, stripe_customer_id, month, units, events, updated_at) VALUES
			('api_requests', 'cus_A', date_trunc('month', now() AT TIME ZONE 'UTC')::date, 100, 9, now()),
			('api_requests', 'cus_B', date_trunc('month', now() AT TIME ZONE 'UTC')::date, 4, 2, now()),
			('api_requests', 'cus_C', date_trunc('month', now() AT TIME ZONE 'UTC')::date, 12, 3, now())`,
	} {
		if _, err := b.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	page = c.mustGet("/usage")
	for _, want := range []string{"Meter caps in " + time.Now().UTC().Format("2006-01"), "100 units</td>",
		"100 units <span class=\"warn\">at the cap</span>", "2 customers, <span class=\"warn\">1 at the cap</span>"} {
		if !strings.Contains(page, want) {
			t.Errorf("the usage page lacks %q", want)
		}
	}
	if strings.Contains(page, "2020-01") {
		t.Error("a cap of another month is shown")
	}
	if page := c.mustGet("/usage?customer=cus_B"); strings.Contains(page, ">cus_A</a></td>\n    <td>every month") {
		t.Error("?customer=cus_B shows cus_A's cap")
	}
}

// A customer billed only through meters has no ledger row: the search box
// still finds it by its Stripe id and lands on its use of each meter this
// month.
func TestSearchFindsAMeterOnlyCustomer(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	c := b.login(t, "alice")
	if _, err := b.pool.Exec(ctx, `INSERT INTO {schema}.meter_usage (event_name, stripe_customer_id, month, units, events, updated_at) VALUES
		('api_requests', 'cus_meters', date_trunc('month', now() AT TIME ZONE 'UTC')::date, 1234, 56, now()),
		('storage_gb', 'cus_meters', date_trunc('month', now() AT TIME ZONE 'UTC')::date, 7, 7, now()),
		('api_requests', 'cus_other', date_trunc('month', now() AT TIME ZONE 'UTC')::date, 99, 1, now())`); err != nil {
		t.Fatal(err)
	}
	r := c.get("/search?q=cus_meters")
	if r.code != http.StatusSeeOther || r.location != "/usage?customer=cus_meters" {
		t.Fatalf("search cus_meters: %d → %q, want 303 → /usage?customer=cus_meters", r.code, r.location)
	}
	page := c.mustGet(r.location)
	for _, want := range []string{"Meters of cus_meters in", `id="customer-use"`, "<td class=\"n\">1234</td><td class=\"n\">56</td>", ">storage_gb<"} {
		if !strings.Contains(page, want) {
			t.Errorf("the customer's usage page lacks %q", want)
		}
	}
	if strings.Contains(page, ">99<") {
		t.Error("another customer's use is shown")
	}
	if r := c.get("/search?q=cus_nobody"); r.code != http.StatusNotFound {
		t.Errorf("search cus_nobody: %d, want 404", r.code)
	}
}
