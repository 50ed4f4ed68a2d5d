package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/internal/ledger"
)

// searchWorld is a ledger, findings and a stream to search: c1 charged
// twice (a ledger row and a duplicate finding), c2 declined with a payment
// intent and a stream message, c3 only in the stream, c9 only in the dead
// letters (an amount in yen), ca and cb sharing one Stripe customer, and an
// orphan charge's finding of no ledger customer.
type searchWorld struct {
	canon, dup string
	fid        int64
	c2Entry    string
	c3Entry    string
	deadID     string
	orphanID   int64
}

func (b *bundle) searchWorld(t *testing.T) searchWorld {
	t.Helper()
	ctx := context.Background()
	var w searchWorld
	w.canon, w.dup, w.fid = b.duplicate(t, "c1", 2500)
	if err := b.rdb.XGroupCreateMkStream(ctx, b.stream, b.group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	add := func(stream, id, payload string, extra ...any) string {
		t.Helper()
		id, err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: id, Values: append([]any{"payload", payload}, extra...)}).Result()
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	w.c2Entry = add(b.stream, "1700000000100-0", `{"customer_id":"c2","billing_period":"2026-11","amount_cents":900}`)
	w.c3Entry = add(b.stream, "1700000000200-0", `{"customer_id":"c3","billing_period":"2026-11","amount_cents":700}`)
	w.deadID = add(b.stream+":dead", "1700000000300-0", `{"customer_id":"c9","billing_period":"2026-11","amount_cents":1500,"currency":"jpy"}`,
		"reason", "spend_cap", "source_id", "1-1", "detail", "cap reached")
	if _, err := b.ledger.SeedForTest(ctx, []ledger.Record{
		{Key: ledger.Key{CustomerID: "c2", BillingPeriod: testPeriod}, StripeCustomerID: "cus_c2", AmountCents: 900,
			IdempotencyKey: key("c2"), Status: ledger.StatusDeclined, StreamMessageID: w.c2Entry},
		{Key: ledger.Key{CustomerID: "ca", BillingPeriod: testPeriod}, StripeCustomerID: "cus_shared", AmountCents: 100, IdempotencyKey: key("ca"), ChargeID: "ch_ca"},
		{Key: ledger.Key{CustomerID: "cb", BillingPeriod: testPeriod}, StripeCustomerID: "cus_shared", AmountCents: 200, IdempotencyKey: key("cb"), ChargeID: "ch_cb"},
		{Key: ledger.Key{CustomerID: "cb", BillingPeriod: "2026-10"}, StripeCustomerID: "cus_shared", AmountCents: 200,
			IdempotencyKey: "k-cb-10", ChargeID: "ch_cb10"},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE {schema}.billing_records SET payment_intent_id = 'pi_c2' WHERE customer_id = 'c2'`); err != nil {
		t.Fatal(err)
	}
	if err := b.pool.QueryRow(ctx, `INSERT INTO {schema}.audit_findings (kind, subject, stripe_customer_id, charge_id, amount_cents, currency, detail)
		VALUES ('orphan_charge', 'ch_orphan', 'cus_orphan', 'ch_orphan', 4200, 'usd', 'no ledger row') RETURNING id`).Scan(&w.orphanID); err != nil {
		t.Fatal(err)
	}
	return w
}

// The search box: each kind of id lands on the page that shows it, with
// what the ledger holds; an id of several places lists them; an id of none
// says so and keeps the query.
func TestSearchLandsOnTheCustomersPeriod(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	w := b.searchWorld(t)
	c := b.login(t, "alice")
	c1 := customerURL("c1", testPeriod)
	for _, tc := range []struct{ name, q, want string }{
		{"customer id", "c1", customerURL("c1", "")},
		{"customer and period", "c1 " + testPeriod, c1},
		{"Stripe customer", "cus_c1", customerURL("c1", "")},
		{"the ledger's charge", w.canon, c1},
		{"a duplicate finding's charge", w.dup, c1},
		{"payment intent", "pi_c2", customerURL("c2", testPeriod)},
		{"the ledger's stream message", w.c2Entry, customerURL("c2", testPeriod)},
		{"a stream entry of no ledger row", w.c3Entry, customerURL("c3", testPeriod)},
		{"a dead letter", w.deadID, customerURL("c9", testPeriod)},
		{"an orphan charge's Stripe customer", "cus_orphan", fmt.Sprintf("/findings/%d", w.orphanID)},
		{"spaces around", "  " + w.canon + " ", c1},
	} {
		r := c.get("/search?q=" + url.QueryEscape(tc.q))
		if r.code != http.StatusSeeOther || r.location != tc.want {
			t.Errorf("%s (%q): %d → %q, want 303 → %q", tc.name, tc.q, r.code, r.location, tc.want)
		}
	}

	// The landing page: the ledger row as the ledger holds it, the
	// charges, the findings, the console's actions on them.
	row, err := getLedgerRow(context.Background(), b.pool, "c1", testPeriod)
	if err != nil || row == nil {
		t.Fatalf("ledger row: %v %v", row, err)
	}
	page := c.mustGet(c1)
	for _, want := range []string{row.ChargeID, w.dup, money(row.AmountCents, row.Currency), string(row.Status), "duplicate_charge",
		fmt.Sprintf(`href="/findings/%d"`, w.fid), `id="dead-letters"`, `id="history"`} {
		if !strings.Contains(page, want) {
			t.Errorf("c1's period page lacks %q", want)
		}
	}
	// c9 has no ledger row: its page shows its dead letter, in yen, with
	// its replay button.
	dead := c.mustGet(customerURL("c9", testPeriod))
	for _, want := range []string{"No ledger row", w.deadID, "1500 JPY", "spend_cap", "/dead/confirm?stream="} {
		if !strings.Contains(dead, want) {
			t.Errorf("c9's period page lacks %q", want)
		}
	}

	// Several places: a list, each a link to its page.
	for _, tc := range []struct {
		q    string
		want []string
	}{
		{"cus_shared", []string{customerURL("ca", ""), customerURL("cb", "")}},
		{testPeriod, []string{"/?period=" + testPeriod, "/findings?period=" + testPeriod}},
	} {
		r := c.get("/search?q=" + url.QueryEscape(tc.q))
		if r.code != http.StatusOK {
			t.Fatalf("%q: %d, want a list", tc.q, r.code)
		}
		for _, u := range tc.want {
			if !strings.Contains(r.body, `href="`+strings.ReplaceAll(u, "&", "&amp;")+`"`) {
				t.Errorf("%q: the list lacks %s", tc.q, u)
			}
		}
		if n := strings.Count(r.body, "<tr><td>"); n != len(tc.want) {
			t.Errorf("%q: %d places listed, want %d", tc.q, n, len(tc.want))
		}
	}

	// Nothing: says so, keeps the query in both boxes.
	for _, q := range []string{"ch_nothing", "nobody", "9-9", "2031-01", "c1 2031-01", `"><script>`} {
		r := c.get("/search?q=" + url.QueryEscape(q))
		if r.code != http.StatusNotFound || !strings.Contains(r.body, `id="search-none"`) {
			t.Errorf("%q: %d, want 404 saying nothing was found", q, r.code)
		}
		esc := strings.NewReplacer(`"`, "&#34;", "<", "&lt;", ">", "&gt;").Replace(q)
		if strings.Count(r.body, `value="`+esc+`"`) != 2 {
			t.Errorf("%q: the query is not kept in the search boxes", q)
		}
	}
	// Search asks Stripe nothing: only the landing page reads charges.
	before := b.sim.Requests()["GET /v1/charges/"+w.dup]
	c.get("/search?q=" + w.dup)
	if after := b.sim.Requests()["GET /v1/charges/"+w.dup]; after != before {
		t.Errorf("the search read the charge at Stripe (%d → %d)", before, after)
	}
	// Nobody logged in: the login page, the query kept for after it.
	if r := b.anon(t).get("/search?q=c1"); r.code != http.StatusSeeOther || !strings.HasPrefix(r.location, "/login?next=%2Fsearch%3Fq%3Dc1") {
		t.Errorf("anonymous search: %d %s", r.code, r.location)
	}
}

// Every search query reads an index: none reads billing_records or
// audit_findings whole.
func TestSearchQueriesUseIndexes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.seedBig(t, 24_000, 5_000)
	ctx := context.Background()
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, sql string
		args      []any
	}{
		{"Stripe customer", qSearchStripeCustomer, []any{"cus_b17", maxHits}},
		{"charge", qSearchCharge, []any{"ch_b4242", maxHits}},
		{"payment intent", qSearchIntent, []any{"pi_x", maxHits}},
		{"stream message", qSearchMessage, []any{"1700000004242-0", maxHits}},
		{"period", qSearchPeriod, []any{"2025-03"}},
		{"findings of a charge", qSearchFindingsCharge, []any{"ch_f42", maxHits}},
		{"findings of a Stripe customer", qSearchFindingsStripeCustomer, []any{"cus_b17", maxHits}},
		{"actions on a page's targets", qActionsOn, []any{[]string{"finding:1", "finding:2"}, 50}},
	} {
		var plan []byte
		if err := conn.QueryRow(ctx, b.pool.SQL(`EXPLAIN (FORMAT JSON) `+tc.sql), tc.args...).Scan(&plan); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var root []struct{ Plan node }
		if err := json.Unmarshal(plan, &root); err != nil {
			t.Fatal(err)
		}
		if seq := root[0].Plan.seqScans(); len(seq) > 0 {
			t.Errorf("%s: sequential scan of %s\n%s", tc.name, strings.Join(seq, ", "), plan)
		}
	}
}

// The customer page's dead letters skip payloads that cannot name the
// customer without decoding them, but never one that names it through a
// JSON escape.
func TestCustomerDeadLettersMatchEscapedPayloads(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	for _, p := range []string{
		`{"customer_id":"c\u0039","billing_period":"2026-11","amount_cents":100}`, // c9, escaped
		`{"customer_id":"c99","billing_period":"2026-11","amount_cents":200}`,     // holds "c9", is not c9
		`{"customer_id":"c9","billing_period":"2026-10","amount_cents":300}`,      // c9, another period
		`{"customer_id":"c8","billing_period":"2026-11","amount_cents":400}`,
	} {
		if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream + ":dead", Values: map[string]any{"payload": p, "reason": "spend_cap"}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	dead, _, err := b.console.deadOf(ctx, "c9", testPeriod)
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 || dead[0].Amount != "1.00 USD" {
		t.Fatalf("c9's dead letters of %s: %+v, want the escaped one alone", testPeriod, dead)
	}
}
