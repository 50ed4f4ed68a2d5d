package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/streamfacts"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

// runConsumer starts a real consumer of the bundle's stream on the
// emulator, watching the pauses as pelguard's binaries do (every 100 ms).
func (b *bundle) runConsumer(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := streamfacts.NewWatcher(b.cfg.DB, b.cfg.Schema, 100*time.Millisecond, nil, testenv.Logger(t))
	if err := w.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	go w.Run(ctx)
	stripe, err := stripeapi.New(stripeapi.Config{APIKey: testKey, BaseURL: b.sim.URL(), MaxNetworkRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(consumer.Config{Redis: b.rdb, DB: b.cfg.DB, Schema: b.cfg.Schema, Stripe: stripe, Stream: b.stream, Group: b.group,
		Namespace: testNS, Block: 50 * time.Millisecond, Lease: 3 * time.Second, Logger: testenv.Logger(t), Paused: w.Func(b.stream, b.group)})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		_ = c.Stop(sctx)
		cancel()
	})
}

func (b *bundle) addCharges(t *testing.T, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		e := event.Event{CustomerID: fmt.Sprintf("p_%d", i), StripeCustomerID: fmt.Sprintf("cus_p%d", i), AmountCents: 700,
			BillingPeriod: testPeriod, Currency: "usd"}
		if err := b.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: b.stream, Values: map[string]any{"payload": e.Payload()}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// pauseForm opens the confirmation page of a pause or resume and returns
// its form with a reason.
func (c *client) pauseForm(stream, do, reason string) url.Values {
	c.t.Helper()
	v := form(c.t, c.mustGet("/pause/confirm?stream="+url.QueryEscape(stream)+"&do="+do))
	v.Set("stream", stream)
	v.Set("do", do)
	v.Set("reason", reason)
	return v
}

// Pausing from the console is the CLI's pause, behind the console's guard:
// a real consumer of the stream charges nothing while paused (events added
// after the pause wait, no ledger lease is held), and after the resume
// every event is charged exactly once. Each change is one console_actions
// row, one stream_fact_changes row naming the person and the reason, and
// one Slack alert of the CLI's kind; a double submit acts once; a second
// pause of a paused stream is refused and changes nothing.
func TestPauseFromTheConsoleStopsAConsumerAndResumes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.runConsumer(t)
	b.addCharges(t, 0, 3)
	testenv.Eventually(t, 20*time.Second, func() bool { return b.sim.ChargeCreates() == 3 }, "3 charged before the pause")

	c := b.login(t, "alice")
	if page := c.mustGet("/pause"); !strings.Contains(page, "running") || !strings.Contains(page, "do=pause") {
		t.Fatalf("pause page: %s", page)
	}
	// Without a reason: the form again, nothing paused.
	v := c.pauseForm(b.stream, actPause, " ")
	if r := c.post("/pause", v); r.code != http.StatusUnprocessableEntity || !strings.Contains(r.body, "reason is required") {
		t.Fatalf("no reason: %d %s", r.code, r.body)
	}
	if n := b.count(t, `SELECT count(*) FROM {schema}.stream_pauses`); n != 0 {
		t.Fatalf("%d pauses without a reason", n)
	}
	before := len(b.mem.Alerts())
	v.Set("reason", "Stripe incident INC-7")
	r1, r2 := c.post("/pause", v), c.post("/pause", v) // a double submit
	if r1.code != http.StatusSeeOther || r2.location != r1.location {
		t.Fatalf("pause: %d → %q, again → %q", r1.code, r1.location, r2.location)
	}
	if n := b.count(t, `SELECT count(*) FROM {schema}.stream_pauses WHERE stream = $1 AND consumer_group = $2
		AND paused_by = 'console:alice' AND reason = 'Stripe incident INC-7'`, b.stream, b.group); n != 1 {
		t.Fatalf("%d pause rows by console:alice", n)
	}
	if n := b.count(t, `SELECT count(*) FROM {schema}.console_actions WHERE actor = 'alice' AND action = 'pause'
		AND target = $1 AND outcome = 'done' AND reason = 'Stripe incident INC-7'`, pauseTarget(Stream{Name: b.stream, Group: b.group})); n != 1 {
		t.Fatalf("%d console_actions rows for the pause", n)
	}
	if page := c.mustGet(r1.location); !strings.Contains(page, "paused billing from "+b.stream) {
		t.Fatalf("action page: %s", page)
	}
	if page := c.mustGet("/pause"); !strings.Contains(page, "Stripe incident INC-7") || !strings.Contains(page, "do=resume") ||
		!strings.Contains(page, `id="paused-banner"`) {
		t.Fatalf("pause page while paused: %s", page)
	}

	// Paused: events added now wait; nothing is charged or leased.
	time.Sleep(300 * time.Millisecond) // the watcher's read (100 ms), with room
	b.addCharges(t, 3, 5)
	time.Sleep(2 * time.Second)
	if n := b.sim.ChargeCreates(); n != 3 {
		t.Fatalf("%d charges made while paused, want 3 (the ones before)", n)
	}
	if n := b.count(t, `SELECT count(*) FROM {schema}.billing_records WHERE status <> 'charged' OR lease_owner IS NOT NULL`); n != 0 {
		t.Fatalf("%d ledger rows started or leased while paused", n)
	}
	// A second pause (a new form) is refused: nothing changes.
	if r := c.post("/pause", c.pauseForm(b.stream, actPause, "again")); r.code != http.StatusSeeOther ||
		!strings.Contains(c.mustGet(r.location), "already paused") {
		t.Fatalf("second pause: %d %s", r.code, r.location)
	}

	// Resumed (by bob): every event charged exactly once.
	bob := b.login(t, "bob")
	if r := bob.post("/pause", bob.pauseForm(b.stream, actResume, "Stripe recovered")); r.code != http.StatusSeeOther {
		t.Fatalf("resume: %d %s", r.code, r.body)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		return b.count(t, `SELECT count(*) FROM {schema}.billing_records WHERE status = 'charged'`) == 8
	}, "8 charged after the resume")
	for i := range 8 {
		if n := b.sim.SucceededCharges(fmt.Sprintf("p_%d", i), testPeriod); n != 1 {
			t.Errorf("p_%d: %d charges, want 1", i, n)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM {schema}.stream_fact_changes WHERE stream = $1 AND
		((fact = 'pause' AND actor = 'console:alice' AND reason = 'Stripe incident INC-7') OR
		 (fact = 'resume' AND actor = 'console:bob' AND reason = 'Stripe recovered'))`, b.stream); n != 2 {
		t.Errorf("%d recorded changes, want the pause and the resume", n)
	}
	if n := b.count(t, `SELECT count(*) FROM {schema}.stream_fact_changes`); n != 2 {
		t.Errorf("%d stream_fact_changes rows, want 2 (the refused pause changed nothing)", n)
	}
	var kinds []string
	for _, a := range b.mem.Alerts()[before:] {
		kinds = append(kinds, string(a.Kind)+": "+a.Title)
	}
	want := []string{string(alerts.KindStreamPaused) + ": Billing paused on " + b.stream,
		string(KindConsoleAction) + ": Console: alice — pause stream:" + b.stream + " group=" + b.group + " (refused)",
		string(alerts.KindStreamPaused) + ": Billing resumed on " + b.stream}
	if strings.Join(kinds, "\n") != strings.Join(want, "\n") {
		t.Errorf("Slack got\n%s\nwant\n%s", strings.Join(kinds, "\n"), strings.Join(want, "\n"))
	}
}

// Only a console allowed to act pauses, only through its confirmation
// form, and only for the person it was made for: anything else is refused
// and pauses nothing.
func TestPauseFromTheConsoleIsRefusedWithoutTheRightToAct(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		readOnly bool
		do       func(t *testing.T, b *bundle) response
		want     int
	}{
		{"read-only console", true, func(t *testing.T, b *bundle) response {
			c := b.login(t, "alice")
			page := c.mustGet("/pause/confirm?stream=" + url.QueryEscape(b.stream) + "&do=pause")
			if strings.Contains(page, `name="token"`) || strings.Contains(c.mustGet("/pause"), "do=pause") {
				t.Error("a read-only console offers the pause")
			}
			return c.post("/pause", url.Values{"csrf": form(t, page)["csrf"], "stream": {b.stream}, "do": {"pause"}, "reason": {"incident"}})
		}, http.StatusForbidden},
		{"another person's form", false, func(t *testing.T, b *bundle) response {
			v := b.login(t, "alice").pauseForm(b.stream, actPause, "incident")
			bob := b.login(t, "bob")
			v.Set("csrf", form(t, bob.mustGet("/pause/confirm?stream="+url.QueryEscape(b.stream)+"&do=pause")).Get("csrf"))
			return bob.post("/pause", v)
		}, http.StatusForbidden},
		{"a resume form posted as a pause", false, func(t *testing.T, b *bundle) response {
			c := b.login(t, "alice")
			v := c.pauseForm(b.stream, actResume, "incident")
			v.Set("do", actPause)
			return c.post("/pause", v)
		}, http.StatusForbidden},
		{"no CSRF token", false, func(t *testing.T, b *bundle) response {
			c := b.login(t, "alice")
			v := c.pauseForm(b.stream, actPause, "incident")
			v.Del("csrf")
			return c.post("/pause", v)
		}, http.StatusForbidden},
		{"not logged in", false, func(t *testing.T, b *bundle) response {
			v := b.login(t, "alice").pauseForm(b.stream, actPause, "incident")
			return b.anon(t).post("/pause", v)
		}, http.StatusUnauthorized},
		{"a stream the console does not show", false, func(t *testing.T, b *bundle) response {
			c := b.login(t, "alice")
			v := c.pauseForm(b.stream, actPause, "incident")
			v.Set("stream", b.stream+"-other")
			return c.post("/pause", v)
		}, http.StatusBadRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(c *Config) { c.AllowActions = !tc.readOnly })
			if r := tc.do(t, b); r.code != tc.want {
				t.Fatalf("status %d, want %d: %s", r.code, tc.want, r.body)
			}
			if n := b.count(t, `SELECT count(*) FROM {schema}.stream_pauses`) + b.count(t, `SELECT count(*) FROM {schema}.stream_fact_changes`) +
				b.count(t, `SELECT count(*) FROM {schema}.console_actions`); n != 0 {
				t.Errorf("%d rows written", n)
			}
			for _, a := range b.mem.Alerts() {
				t.Errorf("Slack got %s: %s", a.Kind, a.Title)
			}
		})
	}
}
