package console

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// The walk over the consumers panel, the PEL page, the Usage page and the
// meter-event browser, in a real Chromium, with a real meter consumer
// running against the real Redis: the panel shows it live with the events
// it handled, a silent consumer and a never-registered one in words the
// PEL page repeats for their entries; the Usage page, reached by its nav
// link and its form, says when the customer's meter was last compared and
// what is not compared yet, and leads to the customer's events, paged;
// on a phone none of these pages scrolls sideways.
func TestBrowserWalkConsumersAndUsage(t *testing.T) {
	t.Parallel()
	meters := testenv.Name(t, "usage")
	w := setupMeters(t, func(c *Config) {
		c.Reaper.MinIdle = time.Millisecond
		c.PageSize = 4
		c.Streams = append(c.Streams, Stream{Name: meters, Group: "meters", Meter: true})
	})
	ctx := context.Background()
	testenv.CleanupKeys(t, w.rdb, meters, consumer.LivenessKey(meters, "meters"), consumer.StatsKey(meters, "meters", "meter-walk"))
	w.seedPEL(t)
	if err := w.rdb.XGroupCreateMkStream(ctx, meters, "meters", "0").Err(); err != nil {
		t.Fatal(err)
	}
	const n = 6
	at := now.Add(-3 * time.Hour)
	for i := range n {
		if err := w.rdb.XAdd(ctx, &redis.XAddArgs{Stream: meters, Values: map[string]any{event.PayloadField: event.MeterEvent{EventName: "api_requests",
			StripeCustomerID: "cus_walk", Value: int64(i + 1), Timestamp: at.Add(time.Duration(i) * time.Second), EventID: fmt.Sprintf("w%d", i)}.Payload()}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	mc, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: w.rdb, DB: w.cfg.DB, Schema: w.cfg.Schema, Stripe: w.cfg.Stripe,
		Stream: meters, Group: "meters", Name: "meter-walk", Namespace: testNS, Block: 50 * time.Millisecond, Lease: 900 * time.Millisecond,
		Logger: testenv.Logger(t), Clock: w.clk})
	if err != nil {
		t.Fatal(err)
	}
	mctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mc.Run(mctx) }()
	t.Cleanup(func() { stop(); <-done })
	w.waitMeterHandled(t, meters, "meters", "meter-walk", done, n)

	bctx := browser(t, 1280, 900)
	if err := chromedp.Do(bctx, w.browserLogin("alice")...); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(bctx, chromedp.Navigate(w.srv.URL+"/?refresh=0"), chromedp.WaitVisible(chromedp.CSS("#live-consumers"))); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"meter-walk": "live, heartbeat", "consumer-dead": "silent 1.0h", "legacy-billing-1": "never registered"} {
		row := text(t, bctx, "#consumer-"+name)
		if !strings.Contains(row, want) {
			t.Errorf("the panel's %s row: %q, want %q", name, row, want)
		}
		// The events it handled as published: at least n (an entry met
		// twice on a loaded machine counts twice), at most what it has
		// published since.
		if handled := w.meterHandled(t, meters, "meters", "meter-walk"); name == "meter-walk" &&
			!slices.ContainsFunc(strings.Fields(row), func(f string) bool { return between(f, n, handled) }) {
			t.Errorf("the meter consumer's row lacks its %d to %d events: %q", n, handled, row)
		}
	}
	// The silent consumer's entries: the PEL page says the same.
	if err := chromedp.Do(bctx, chromedp.Click(`//tr[@id="consumer-consumer-dead"]//a`), chromedp.WaitVisible(`//h1[starts-with(text(), "Pending entries")]`)); err != nil {
		t.Fatal(err)
	}
	if owners := text(t, bctx, "table.pel"); !strings.Contains(owners, "silent 1.0h") || strings.Contains(owners, "registered\n") {
		t.Errorf("the PEL page's owner states: %q", owners)
	}

	// Usage, before any run: nothing claimed; then a run, and the page by its form.
	if err := chromedp.Do(bctx, chromedp.Click(`//nav/a[text()="Usage"]`), chromedp.WaitVisible(`//h1[text()="Usage"]`)); err != nil {
		t.Fatal(err)
	}
	if none := text(t, bctx, "#usage-none"); !strings.Contains(none, "nothing is compared, and no agreement is claimed") {
		t.Errorf("before any run: %q", none)
	}
	w.tick(15 * time.Minute)
	rep, err := w.usage.ReconcileUsage(ctx)
	if err != nil || rep.WindowsCompared != 1 {
		t.Fatalf("the usage run: %+v %v", rep, err)
	}
	if err := chromedp.Do(bctx, chromedp.Navigate(w.srv.URL+"/usage"), chromedp.WaitVisible(chromedp.CSS(`input[name=customer]`)),
		chromedp.SendKeys(chromedp.CSS(`form.filters input[name=customer]`), "cus_walk"),
		chromedp.Submit(chromedp.CSS(`form.filters input[name=customer]`)),
		chromedp.WaitVisible(chromedp.CSS("#usage-compared"))); err != nil {
		t.Fatal(err)
	}
	if row := text(t, bctx, "#compared-api_requests"); !strings.Contains(row, fmt.Sprintf("run #%d", rep.RunID)) || !strings.Contains(row, fmt.Sprint(n)) {
		t.Errorf("the customer's meter: %q", row)
	}
	// Its events, two pages of four.
	if err := chromedp.Do(bctx, chromedp.Click(`//tr[@id="compared-api_requests"]//a`), chromedp.WaitVisible(`//h1[text()="Meter events"]`)); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		v, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll('#meter-events tr[data-status="delivered"]').length`))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	first := count()
	if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS("#older")), chromedp.WaitVisible(`//a[text()="newest"]`)); err != nil {
		t.Fatal(err)
	}
	if second := count(); first != 4 || second != n-4 {
		t.Errorf("pages of %d and %d delivered events, want 4 and %d", first, second, n-4)
	}

	// On a phone nothing scrolls sideways.
	if err := chromedp.Do(bctx, chromedp.EmulateViewport(375, 812)); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/?refresh=0", "/pel?stream=" + w.stream, "/usage?customer=cus_walk", "/meter-events?customer=cus_walk"} {
		if err := chromedp.Do(bctx, chromedp.Navigate(w.srv.URL+p), chromedp.WaitVisible(chromedp.CSS("h1"))); err != nil {
			t.Fatal(err)
		}
		widths, err := chromedp.Run(bctx, chromedp.Evaluate[[]int](`[document.documentElement.scrollWidth, document.documentElement.clientWidth]`))
		if err != nil {
			t.Fatal(err)
		}
		if widths[0] > widths[1]+1 {
			wide, _ := chromedp.Run(bctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('main *')].filter(e => e.getBoundingClientRect().right > document.documentElement.clientWidth + 1).slice(0, 5).map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right))`))
			t.Errorf("%s is %d px wide on a %d px screen: %v", p, widths[0], widths[1], wide)
		}
	}
}
