package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
)

// A reason typed into an action with a secret in it is redacted before it
// is stored, shown or sent to Slack, as the alerts are: a live key, a
// restricted key, a webhook secret, a password in a URL, a card number.
func TestActionReasonIsRedacted(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, _, fid := b.duplicate(t, "c1", 2500)
	secrets := []string{"sk_live_4eC39HqLyjWDarjtT1zdp7dc", "rk_live_51Habcdefghijk", "whsec_abcdefghijklmnop",
		"s3cr3tpw", "4242 4242 4242 4242"}
	reason := "customer pasted sk_live_4eC39HqLyjWDarjtT1zdp7dc and rk_live_51Habcdefghijk, whsec_abcdefghijklmnop, " +
		"postgres://app:s3cr3tpw@db.internal/billing and card 4242 4242 4242 4242"
	c := b.login(t, "alice")
	v := form(t, c.mustGet(fmt.Sprintf("/findings/%d/confirm?action=dismiss", fid)))
	v.Set("reason", reason)
	r := c.post(fmt.Sprintf("/findings/%d/dismiss", fid), v)
	if r.code != http.StatusSeeOther {
		t.Fatalf("dismiss: %d %s", r.code, r.body)
	}
	var stored string
	if err := b.pool.QueryRow(context.Background(), `SELECT reason FROM {schema}.console_actions`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	pages := map[string]string{"stored": stored, "action page": c.mustGet(r.location), "actions page": c.mustGet("/actions")}
	alerts := b.mem.Alerts()
	if len(alerts) == 0 {
		t.Fatal("no alert for the action")
	}
	for _, a := range alerts {
		if a.Kind == KindConsoleAction {
			pages["alert "+a.Title] = a.Text
		}
	}
	for where, text := range pages {
		if !strings.Contains(text, "[REDACTED]") {
			t.Errorf("%s: the reason is not there, redacted: %.300s", where, text)
		}
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("%s holds the secret %q", where, s)
			}
		}
	}
	if !strings.Contains(stored, "customer pasted") || !strings.Contains(stored, "app:") {
		t.Errorf("the reason lost its words: %q", stored)
	}
}

// A NUL byte or invalid UTF-8 in any query or form parameter (the login
// form included, before any login), and a malformed stream id on /dead,
// /dead/confirm, /dead/replay and /pel, are answered 400 with a message of
// ours: no 500, no Postgres or Redis error text, nothing acted on.
func TestCarelessInputIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: consumer.DeadLetterStream(b.stream), Values: map[string]any{
		"payload": `{"customer_id":"c7","billing_period":"2026-11","amount_cents":1999}`, "reason": "spend_cap", "source_id": "1-1"}}).Err(); err != nil {
		t.Fatal(err)
	}
	anon, c := b.anon(t), b.login(t, "alice")
	st := url.QueryEscape(b.stream)
	gets := []string{
		"/search?q=%00", "/search?q=%ff%fe", "/customer?customer=c1%00&period=2026-11", "/customer?customer=%c3%28",
		"/findings?kind=%00", "/findings?state=%80", "/ledger?customer=%00", "/usage?customer=%00", "/usage?meter=%ff",
		"/actions?before=%00", "/dead?stream=" + st + "&reason=%00", "/pel?stream=" + st + "&consumer=%ff",
		"/?period=%00", "/dead?stream=%00", "/findings?x%00=1", "/search?q=%zz",
		"/dead?stream=" + st + "&after=not-an-id", "/dead?stream=" + st + "&after=1-2-3", "/dead?stream=" + st + "&after=%2B",
		"/dead/confirm?stream=" + st + "&id=abc", "/pel?stream=" + st + "&after=1-x",
	}
	for _, p := range gets {
		r := c.get(p)
		if r.code != http.StatusBadRequest || !strings.HasPrefix(r.body, "bad request: ") {
			t.Errorf("GET %s: %d %.200s, want 400 with our message", p, r.code, r.body)
		}
		for _, leak := range []string{"SQLSTATE", "ERR ", "invalid byte sequence", "pq:", "redis:"} {
			if strings.Contains(r.body, leak) {
				t.Errorf("GET %s leaks %q: %s", p, leak, r.body)
			}
		}
	}
	for _, form := range []url.Values{
		{"user": {"alice\x00"}, "password": {testPassword}, "next": {"/"}},
		{"user": {"alice"}, "password": {"\xff\xfe"}, "next": {"/"}},
		{"user": {"alice"}, "password": {testPassword}, "next": {"/\x00"}},
	} {
		if r := anon.post("/login", form); r.code != http.StatusBadRequest || !strings.HasPrefix(r.body, "bad request: ") {
			t.Errorf("POST /login %q: %d %.200s", form, r.code, r.body)
		}
	}
	page := c.mustGet("/dead/confirm?stream=" + st + "&reason=spend_cap")
	v := form(t, page)
	v.Set("stream", b.stream)
	v.Set("reason", "ticket 1")
	for _, bad := range []url.Values{{"id": {"0-0\x00"}}, {"id": {"x-1"}}, {"reason_filter": {"spend\xffcap"}}} {
		f := url.Values{}
		for k, vs := range v {
			f[k] = vs
		}
		for k, vs := range bad {
			f[k] = vs
		}
		if r := c.post("/dead/replay", f); r.code != http.StatusBadRequest {
			t.Errorf("POST /dead/replay %v: %d %.200s", bad, r.code, r.body)
		}
	}
	if n := b.rdb.XLen(ctx, b.stream).Val(); n != 0 {
		t.Fatalf("a refused replay replayed %d entries", n)
	}
	if n := b.count(t, `SELECT count(*) FROM {schema}.console_actions`); n != 0 {
		t.Fatalf("%d actions recorded from refused input", n)
	}
	// Well-formed ids still work.
	for _, p := range []string{"/dead?stream=" + st + "&after=1764806400000-0", "/dead?stream=" + st + "&after=1764806400000",
		"/pel?stream=" + st + "&after=0-1", "/search?q=" + url.QueryEscape("café")} {
		if r := c.get(p); r.code == http.StatusBadRequest || r.code >= 500 {
			t.Errorf("GET %s: %d %.200s", p, r.code, r.body)
		}
	}
}
