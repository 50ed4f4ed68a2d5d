package console

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/ledger"
)

func TestPagesRenderTheSeededRows(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	canon, dup, fid := b.duplicate(t, "c1", 2500)
	if _, err := b.ledger.SeedForTest(ctx, []ledger.Record{
		{Key: ledger.Key{CustomerID: "c2", BillingPeriod: testPeriod}, StripeCustomerID: "cus_c2", AmountCents: 900, IdempotencyKey: key("c2"), Status: ledger.StatusDeclined},
		{Key: ledger.Key{CustomerID: "c3", BillingPeriod: testPeriod}, StripeCustomerID: "cus_c3", AmountCents: 700, IdempotencyKey: key("c3"), Status: ledger.StatusPending},
	}); err != nil {
		t.Fatal(err)
	}
	// Money in motion (migration 00008): a declined row the ledger retries.
	if _, err := b.pool.Exec(ctx, `UPDATE {schema}.billing_records SET attempt = 2, next_attempt_at = $1, failure_code = 'insufficient_funds'
		WHERE customer_id = 'c2'`, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.SetCap(ctx, testPeriod, 100_000); err != nil {
		t.Fatal(err)
	}
	// A stream entry the ledger names, one pending in the group, and a
	// dead letter whose payload carries a card number and a key.
	if err := b.rdb.XGroupCreateMkStream(ctx, b.stream, b.group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	id, err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: map[string]any{"payload": `{"customer_id":"c1","billing_period":"2026-11"}`}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: b.group, Consumer: "w1", Streams: []string{b.stream, ">"}, Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE {schema}.billing_records SET stream_message_id = $1 WHERE customer_id = 'c1'`, id); err != nil {
		t.Fatal(err)
	}
	if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream + ":dead", Values: map[string]any{
		"payload": `{"customer_id":"c9","billing_period":"2026-11","amount_cents":5,"card":"4242424242424242","k":"sk_live_abcdef123456"}`,
		"reason":  "spend_cap", "source_id": "1-1", "detail": "cap reached"}}).Err(); err != nil {
		t.Fatal(err)
	}

	c := b.login(t, "alice")
	over := c.mustGet("/")
	for _, want := range []string{"charged", "declined", "pending", "duplicate_charge", "25.00", "spend_cap", b.stream, "1000.00"} {
		if !strings.Contains(over, want) {
			t.Errorf("overview lacks %q", want)
		}
	}
	list := c.mustGet("/findings?state=open")
	if !strings.Contains(list, fmt.Sprintf(`/findings/%d"`, fid)) || !strings.Contains(list, dup) {
		t.Errorf("findings page lacks finding %d / %s", fid, dup)
	}
	if other := c.mustGet("/findings?state=dismissed"); strings.Contains(other, dup) {
		t.Error("the dismissed filter shows an open finding")
	}
	page := c.mustGet(fmt.Sprintf("/findings/%d", fid))
	for _, want := range []string{canon, dup, "https://dashboard.stripe.com/test/payments/" + dup, "succeeded", "Refund the duplicate"} {
		if !strings.Contains(page, want) {
			t.Errorf("finding page lacks %q", want)
		}
	}
	cust := c.mustGet("/customer?customer=c1&period=" + testPeriod)
	for _, want := range []string{"charged", canon, id, "pending at w1", "duplicate_charge"} {
		if !strings.Contains(cust, want) {
			t.Errorf("customer page lacks %q", want)
		}
	}
	motion := c.mustGet("/customer?customer=c2&period=" + testPeriod)
	for _, want := range []string{"declined", "attempt 2", "next attempt 2026-12-01 13:00:00Z", "insufficient_funds"} {
		if !strings.Contains(motion, want) {
			t.Errorf("customer page of a retried decline lacks %q", want)
		}
	}
	dead := c.mustGet("/dead?stream=" + url.QueryEscape(b.stream))
	if !strings.Contains(dead, "c9") || !strings.Contains(dead, "spend_cap") {
		t.Error("dead-letter page lacks the entry")
	}
	for path, body := range map[string]string{"/": over, "/dead": dead, "/customer": cust} {
		if strings.Contains(body, "4242424242424242") || strings.Contains(body, "sk_live_abcdef123456") {
			t.Errorf("%s shows a card number or a key", path)
		}
	}
	if r := c.get("/findings/999999"); r.code != http.StatusNotFound {
		t.Errorf("unknown finding: %d", r.code)
	}
}

func TestSecurityHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.login(t, "alice").get("/")
	if csp := r.header.Get("Content-Security-Policy"); !strings.Contains(csp, "frame-ancestors 'none'") || !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("CSP %q", csp)
	}
	if r.header.Get("X-Frame-Options") != "DENY" || r.header.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("headers %v", r.header)
	}
}

// Every refusal changes nothing: no Stripe refund, no refund_ledger row, no
// console_actions row, the finding still open.
func TestActionsRefusedChangeNothing(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		readOnly bool
		do       func(b *bundle, fid int64) response
		want     int
	}{
		{"no session", false, func(b *bundle, fid int64) response {
			return b.anon(t).post(fmt.Sprintf("/findings/%d/refund", fid), url.Values{"reason": {"x"}})
		}, http.StatusUnauthorized},
		{"no CSRF token", false, func(b *bundle, fid int64) response {
			c := b.login(t, "alice")
			v := form(t, c.mustGet(fmt.Sprintf("/findings/%d/confirm?action=refund", fid)))
			v.Del("csrf")
			v.Set("reason", "dup")
			return c.post(fmt.Sprintf("/findings/%d/refund", fid), v)
		}, http.StatusForbidden},
		{"another user's CSRF token", false, func(b *bundle, fid int64) response {
			v := form(t, b.login(t, "bob").mustGet(fmt.Sprintf("/findings/%d/confirm?action=refund", fid)))
			v.Set("reason", "dup")
			return b.login(t, "alice").post(fmt.Sprintf("/findings/%d/refund", fid), v)
		}, http.StatusForbidden},
		{"a token made for dismiss", false, func(b *bundle, fid int64) response {
			c := b.login(t, "alice")
			v := form(t, c.mustGet(fmt.Sprintf("/findings/%d/confirm?action=dismiss", fid)))
			v.Set("reason", "dup")
			return c.post(fmt.Sprintf("/findings/%d/refund", fid), v)
		}, http.StatusForbidden},
		{"no reason", false, func(b *bundle, fid int64) response {
			c := b.login(t, "alice")
			v := form(t, c.mustGet(fmt.Sprintf("/findings/%d/confirm?action=refund", fid)))
			v.Set("reason", "  ")
			return c.post(fmt.Sprintf("/findings/%d/refund", fid), v)
		}, http.StatusUnprocessableEntity}, // the form again, saying a reason is missing (TestMissingReasonKeepsTheForm)
		{"a GET", false, func(b *bundle, fid int64) response {
			return b.login(t, "alice").get(fmt.Sprintf("/findings/%d/refund", fid))
		}, http.StatusMethodNotAllowed},
		{"read-only", true, func(b *bundle, fid int64) response {
			c := b.login(t, "alice")
			page := c.mustGet(fmt.Sprintf("/findings/%d/confirm?action=refund", fid))
			if strings.Contains(page, `name="token"`) {
				t.Error("a read-only console offers the form")
			}
			return c.post(fmt.Sprintf("/findings/%d/refund", fid), url.Values{"csrf": form(t, page)["csrf"], "reason": {"dup"}})
		}, http.StatusForbidden},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(c *Config) { c.AllowActions = !tc.readOnly })
			_, dup, fid := b.duplicate(t, "c1", 2500)
			if r := tc.do(b, fid); r.code != tc.want {
				t.Fatalf("status %d, want %d: %s", r.code, tc.want, r.body)
			}
			if n := b.refundPosts(); n != 0 {
				t.Errorf("%d refund POSTs", n)
			}
			if ch, _ := b.sim.Charge(dup); ch.AmountRefunded != 0 {
				t.Errorf("duplicate refunded %d", ch.AmountRefunded)
			}
			if n := b.count(t, `SELECT count(*) FROM {schema}.refund_ledger`) + b.count(t, `SELECT count(*) FROM {schema}.console_actions`); n != 0 {
				t.Errorf("%d rows written", n)
			}
			if f, _ := b.auditor.Store().Get(context.Background(), fid); f.State != audit.StateOpen {
				t.Errorf("finding %s", f.State)
			}
		})
	}
}

// A refund through the console: exactly one Stripe refund, one refund_ledger
// row (source names the person), one console_actions row, one Slack alert;
// the same form submitted again — twice at once, then once more — refunds
// nothing more and records nothing more.
func TestRefundThroughTheConsoleRefundsOnceAndRecordsWhoAndWhy(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, dup, fid := b.duplicate(t, "c1", 2500)
	c := b.login(t, "alice")
	v := form(t, c.mustGet(fmt.Sprintf("/findings/%d/confirm?action=refund", fid)))
	v.Set("reason", "customer wrote in: charged twice for November")
	before := len(b.mem.Alerts())
	var wg sync.WaitGroup
	results := make([]response, 3)
	for i := range 2 {
		wg.Go(func() { results[i] = c.post(fmt.Sprintf("/findings/%d/refund", fid), v) })
	}
	wg.Wait()
	results[2] = c.post(fmt.Sprintf("/findings/%d/refund", fid), v)
	for i, r := range results {
		if r.code != http.StatusSeeOther || r.location != results[0].location {
			t.Fatalf("submit %d: %d → %q, want 303 to one action page (%q)", i, r.code, r.location, results[0].location)
		}
	}
	if n := b.refundPosts(); n != 1 {
		t.Fatalf("%d Stripe refund POSTs, want 1", n)
	}
	if ch, _ := b.sim.Charge(dup); ch.AmountRefunded != 2500 {
		t.Fatalf("duplicate refunded %d, want 2500", ch.AmountRefunded)
	}
	if n := b.count(t, `SELECT count(*) FROM {schema}.refund_ledger WHERE charge_id = $1 AND source = 'console:alice'`, dup); n != 1 {
		t.Fatalf("%d refund_ledger rows from console:alice", n)
	}
	if n := b.count(t, `SELECT count(*) FROM {schema}.console_actions WHERE actor = 'alice' AND action = 'refund'
		AND target = $1 AND outcome = 'done' AND reason LIKE 'customer wrote in%'`, findingTarget(fid)); n != 1 {
		t.Fatalf("%d console_actions rows", n)
	}
	if n := b.count(t, `SELECT count(*) FROM {schema}.console_actions`); n != 1 {
		t.Fatalf("%d console_actions rows in all", n)
	}
	if f, _ := b.auditor.Store().Get(context.Background(), fid); f.State != audit.StateRefunded {
		t.Fatalf("finding %s, want refunded", f.State)
	}
	var sent []string
	for _, a := range b.mem.Alerts()[before:] {
		if a.Kind == KindConsoleAction {
			sent = append(sent, a.Title+" "+a.Text)
		}
	}
	if len(sent) != 1 || !strings.Contains(sent[0], "alice") || !strings.Contains(sent[0], "charged twice") {
		t.Fatalf("Slack got %q", sent)
	}
	page := c.mustGet(results[0].location)
	if !strings.Contains(page, "refunded 25.00") || !strings.Contains(page, "alice") {
		t.Fatalf("action page: %s", page)
	}
	// A second confirmation (a new token) is refused by the finding's state.
	v2 := form(t, c.mustGet(fmt.Sprintf("/findings/%d/confirm?action=refund", fid)))
	v2.Set("reason", "again")
	r := c.post(fmt.Sprintf("/findings/%d/refund", fid), v2)
	if page := c.mustGet(r.location); !strings.Contains(page, "refused") || b.refundPosts() != 1 {
		t.Fatalf("second refund: %d POSTs, page %s", b.refundPosts(), page)
	}
}

// The rolling cap the auditor persisted binds the console too.
func TestConsoleRefundStopsAtTheRollingCap(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, dup, fid := b.duplicate(t, "c1", 2500)
	// An earlier refund by `auditor refund` used up the rolling cents.
	if _, err := b.pool.Exec(context.Background(), `INSERT INTO {schema}.refund_ledger (refunded_at, charge_id, refund_id, amount_cents, currency, source)
		VALUES ($1, 'ch_earlier', 're_earlier', $2, 'usd', 'auditor refund')`, now.Add(-time.Hour), audit.DefaultMaxCents24h-1000); err != nil {
		t.Fatal(err)
	}
	c := b.login(t, "alice")
	v := form(t, c.mustGet(fmt.Sprintf("/findings/%d/confirm?action=refund", fid)))
	v.Set("reason", "dup")
	r := c.post(fmt.Sprintf("/findings/%d/refund", fid), v)
	page := c.mustGet(r.location)
	if !strings.Contains(page, "max_cents_24h") || b.refundPosts() != 0 {
		t.Fatalf("%d POSTs; page %s", b.refundPosts(), page)
	}
	if ch, _ := b.sim.Charge(dup); ch.AmountRefunded != 0 {
		t.Fatal("refunded past the rolling cap")
	}
}

func TestDismissAndResolveAreRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, _, fid := b.duplicate(t, "c1", 2500)
	c := b.login(t, "bob")
	for _, action := range []string{"dismiss", "resolve"} {
		v := form(t, c.mustGet(fmt.Sprintf("/findings/%d/confirm?action=%s", fid, action)))
		v.Set("reason", "checked by hand")
		if r := c.post(fmt.Sprintf("/findings/%d/%s", fid, action), v); r.code != http.StatusSeeOther {
			t.Fatalf("%s: %d %s", action, r.code, r.body)
		}
	}
	if f, _ := b.auditor.Store().Get(context.Background(), fid); f.State != audit.StateResolved {
		t.Fatalf("finding %s", f.State)
	}
	if n := b.count(t, `SELECT count(*) FROM {schema}.console_actions WHERE actor = 'bob' AND outcome = 'done'`); n != 2 {
		t.Fatalf("%d actions", n)
	}
	if b.refundPosts() != 0 {
		t.Fatal("a dismissal refunded")
	}
}

// Replay goes through the consumer's own replay: one entry, then all of a
// reason; a second submit of the one-entry form replays nothing more.
func TestReplayDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	var ids []string
	for i, reason := range []string{"spend_cap", "spend_cap", "stripe_key_error"} {
		id, err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: consumer.DeadLetterStream(b.stream), Values: map[string]any{
			"payload": fmt.Sprintf(`{"customer_id":"c%d"}`, i), "reason": reason, "source_id": "1-1"}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	c := b.login(t, "alice")
	v := form(t, c.mustGet("/dead/confirm?stream="+url.QueryEscape(b.stream)+"&id="+ids[2]))
	v.Set("stream", b.stream)
	v.Set("id", ids[2])
	v.Set("reason", "key fixed")
	r1 := c.post("/dead/replay", v)
	r2 := c.post("/dead/replay", v)
	if r1.code != http.StatusSeeOther || r1.location != r2.location {
		t.Fatalf("%d %q / %q", r1.code, r1.location, r2.location)
	}
	if n := b.rdb.XLen(ctx, b.stream).Val(); n != 1 {
		t.Fatalf("stream has %d entries after one replay submitted twice", n)
	}
	v = form(t, c.mustGet("/dead/confirm?stream="+url.QueryEscape(b.stream)+"&reason=spend_cap"))
	v.Set("stream", b.stream)
	v.Set("reason_filter", "spend_cap")
	v.Set("reason", "cap raised")
	if r := c.post("/dead/replay", v); r.code != http.StatusSeeOther {
		t.Fatalf("%d %s", r.code, r.body)
	}
	if n, d := b.rdb.XLen(ctx, b.stream).Val(), b.rdb.XLen(ctx, consumer.DeadLetterStream(b.stream)).Val(); n != 3 || d != 0 {
		t.Fatalf("stream %d, dead %d", n, d)
	}
	if n := b.count(t, `SELECT count(*) FROM {schema}.console_actions WHERE outcome = 'done' AND action IN ('replay', 'replay_reason')`); n != 2 {
		t.Fatalf("%d replay actions", n)
	}
}

func TestProxyUserHeaderOnlyFromTrustedProxies(t *testing.T) {
	t.Parallel()
	trusted := setup(t, func(c *Config) {
		c.Users, c.ProxyUserHeader, c.TrustedProxies = nil, "X-Forwarded-User", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	})
	c := trusted.anon(t)
	req, _ := http.NewRequest(http.MethodGet, trusted.srv.URL+"/", nil)
	req.Header.Set("X-Forwarded-User", "carol")
	if r := c.do(req); r.code != http.StatusOK || !strings.Contains(r.body, "carol") {
		t.Fatalf("trusted proxy: %d", r.code)
	}
	if r := c.get("/"); r.code != http.StatusUnauthorized {
		t.Fatalf("no header: %d", r.code)
	}
	// Two user headers, or two names in one: neither is believed.
	for _, two := range [][]string{{"carol", "mallory"}, {"carol,mallory"}} {
		req, _ = http.NewRequest(http.MethodGet, trusted.srv.URL+"/", nil)
		for _, v := range two {
			req.Header.Add("X-Forwarded-User", v)
		}
		if r := c.do(req); r.code != http.StatusBadRequest || strings.Contains(r.body, "carol") {
			t.Fatalf("user headers %q: %d %s", two, r.code, r.body)
		}
	}
	untrusted := setup(t, func(c *Config) {
		c.Users, c.ProxyUserHeader, c.TrustedProxies = nil, "X-Forwarded-User", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	})
	req, _ = http.NewRequest(http.MethodGet, untrusted.srv.URL+"/", nil)
	req.Header.Set("X-Forwarded-User", "mallory")
	if r := untrusted.anon(t).do(req); r.code != http.StatusForbidden {
		t.Fatalf("untrusted address: %d", r.code)
	}
}

func TestLoginRefusesAWrongPassword(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c := b.anon(t)
	if r := c.post("/login", url.Values{"user": {"alice"}, "password": {"nope"}}); r.code != http.StatusUnauthorized {
		t.Fatalf("%d", r.code)
	}
	if r := c.get("/"); r.code != http.StatusSeeOther || !strings.HasPrefix(r.location, "/login") {
		t.Fatalf("%d %q", r.code, r.location)
	}
	if r := c.post("/login", url.Values{"user": {"alice"}, "password": {testPassword}, "next": {"//evil.example"}}); r.location != "/" {
		t.Fatalf("open redirect: %q", r.location)
	}
}

func TestConfigNeedsAnIdentity(t *testing.T) {
	t.Parallel()
	err := Config{DB: nil}.Validate()
	if err == nil || !strings.Contains(err.Error(), "no identity") {
		t.Fatalf("%v", err)
	}
	if _, err := LoadUsers(strings.NewReader("alice:plaintext\n")); err == nil {
		t.Fatal("a plaintext password was accepted")
	}
}
