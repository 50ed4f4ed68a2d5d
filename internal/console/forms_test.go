package console

import (
	"context"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
)

var hiddenField = regexp.MustCompile(`<input type="hidden" name="([a-z_]+)" value="([^"]*)">`)

// formOf reads every hidden field of a page's form, as a browser submits
// them.
func formOf(page string) url.Values {
	v := url.Values{}
	for _, m := range hiddenField.FindAllStringSubmatch(page, -1) {
		v.Set(m[1], html.UnescapeString(m[2]))
	}
	return v
}

var h1 = regexp.MustCompile(`<h1>([^<]*)</h1>`)

// A confirmation page says what the action is in words; a submit without
// a reason gets the same form back (422), saying what is missing, its
// one-time token still good; with a reason it then acts once.
func TestMissingReasonKeepsTheForm(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	_, dup, fid := b.duplicate(t, "c1", 2500)
	for _, reason := range []string{"spend_cap", "spend_cap"} {
		if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: consumer.DeadLetterStream(b.stream), Values: map[string]any{
			"payload": `{"customer_id":"c7","billing_period":"2026-11","amount_cents":1999}`, "reason": reason, "source_id": "1-1"}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	c := b.login(t, "alice")
	cases := []struct {
		confirm, post, title, button string
		done                         func() bool
	}{
		{fmt.Sprintf("/findings/%d/confirm?action=refund", fid), fmt.Sprintf("/findings/%d/refund", fid),
			"Refund 25.00 USD of duplicate charge " + dup, "Refund 25.00 USD",
			func() bool { ch, _ := b.sim.Charge(dup); return ch.AmountRefunded == 2500 && b.refundPosts() == 1 }},
		{"/dead/confirm?stream=" + url.QueryEscape(b.stream) + "&reason=spend_cap", "/dead/replay",
			"Replay every dead letter of reason “spend_cap”", "Replay 2 dead letters",
			func() bool { return b.rdb.XLen(ctx, b.stream).Val() == 2 }},
	}
	for _, tc := range cases {
		page := c.mustGet(tc.confirm)
		if m := h1.FindStringSubmatch(page); m == nil || html.UnescapeString(m[1]) != tc.title {
			t.Errorf("%s: title %q, want %q", tc.confirm, m, tc.title)
		}
		if !strings.Contains(page, ">"+tc.button+"</button>") || strings.Contains(page, "Confirm:") {
			t.Errorf("%s: the button does not say %q", tc.confirm, tc.button)
		}
		v := formOf(page)
		v.Set("reason", " \n ")
		r := c.post(tc.post, v)
		if r.code != http.StatusUnprocessableEntity || !strings.Contains(r.body, "A reason is required") {
			t.Fatalf("%s without a reason: %d\n%s", tc.post, r.code, r.body)
		}
		again := formOf(r.body)
		if again.Get("token") != v.Get("token") || !strings.Contains(r.body, `aria-invalid="true"`) || !strings.Contains(r.body, tc.title) {
			t.Errorf("%s: the form came back changed: %v vs %v", tc.post, again, v)
		}
		if tc.done() {
			t.Fatalf("%s acted without a reason", tc.post)
		}
		if n := b.count(t, `SELECT count(*) FROM {schema}.console_actions`); n != 0 && tc.post != "/dead/replay" {
			t.Fatalf("%d actions recorded without a reason", n)
		}
		again.Set("reason", "ticket 99")
		if r := c.post(tc.post, again); r.code != http.StatusSeeOther {
			t.Fatalf("%s with the reason: %d %s", tc.post, r.code, r.body)
		}
		if !tc.done() {
			t.Fatalf("%s: the form kept after a missing reason did not act", tc.post)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM {schema}.console_actions WHERE outcome = 'done'`); n != 2 {
		t.Fatalf("%d actions done, want 2", n)
	}
}

// Amounts read as money: a dead letter's minor units in its currency (yen
// has no decimals), an amount that is not whole minor units as sent.
func TestDeadLetterAmountsAsMoney(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	for _, p := range []string{
		`{"customer_id":"c1","amount_cents":2500,"currency":"usd"}`,
		`{"customer_id":"c2","amount_cents":1500,"currency":"jpy"}`,
		`{"customer_id":"c3","amount_cents":7}`,
		`{"customer_id":"c4","amount_cents":"12.5","currency":"eur"}`,
	} {
		if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: consumer.DeadLetterStream(b.stream), Values: map[string]any{
			"payload": p, "reason": "invalid_amount", "source_id": "1-1"}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	page := b.login(t, "alice").mustGet("/dead?stream=" + url.QueryEscape(b.stream))
	for _, want := range []string{"25.00 USD", "1500 JPY", "0.07 USD", "&#34;12.5&#34; eur"} {
		if !strings.Contains(page, want) {
			t.Errorf("dead letters lack %q", want)
		}
	}
	for _, raw := range []string{">2500 usd<", ">1500 jpy<"} {
		if strings.Contains(page, raw) {
			t.Errorf("dead letters show raw minor units %q", raw)
		}
	}
}
