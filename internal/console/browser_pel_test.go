package console

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/reaper"
)

// A real Chromium opens the PEL page from the nav: one row per pending
// entry in Redis, each with the reaper's verdict — the live consumer's
// entry left alone (its lease is live), the dead consumer's to be claimed,
// the charged one acked without a charge, the unregistered owner's left
// alone — then follows the dead consumer's link to its entries alone.
func TestBrowserPELPage(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.Reaper.MinIdle = time.Millisecond; c.Refresh = -1 })
	w := b.seedPEL(t)
	ctx := browser(t, 1200, 900)
	if err := chromedp.Do(ctx, b.browserLogin("alice")...); err != nil {
		t.Fatal(err)
	}
	kinds := func() map[string]string {
		t.Helper()
		m, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]string](
			`Object.fromEntries([...document.querySelectorAll('tr[data-kind]')].map(r => [r.id.slice(4), r.dataset.kind]))`))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if err := chromedp.Do(ctx, chromedp.Click(`//nav/a[text()="PEL"]`), chromedp.WaitVisible(chromedp.CSS(`table.pel`))); err != nil {
		t.Fatal(err)
	}
	got := kinds()
	pend, err := b.rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: b.stream, Group: b.group, Start: "-", End: "+", Count: 100}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(pend) {
		t.Fatalf("the page shows %d entries, Redis has %d pending", len(got), len(pend))
	}
	want := map[string]reaper.Kind{w.live: reaper.KindLeaseLive, w.dead: reaper.KindClaim, w.charged: reaper.KindAlreadyBilled,
		w.legacy: reaper.KindUnregistered}
	for id, k := range want {
		if got[id] != string(k) {
			t.Errorf("entry %s: the page says %q, want %q", id, got[id], k)
		}
	}
	charged := text(t, ctx, `tr[id="pel-`+w.charged+`"]`)
	if !strings.Contains(charged, "ccharged/"+testPeriod) || !strings.Contains(charged, "charged") {
		t.Errorf("the charged entry's row does not show its ledger row: %q", charged)
	}
	if err := chromedp.Do(ctx, chromedp.Click(`//tr[@id="pel-`+w.dead+`"]//a[text()="consumer-dead"]`),
		chromedp.WaitVisible(`//h1[starts-with(text(), "Pending entries")]`)); err != nil {
		t.Fatal(err)
	}
	if u, err := chromedp.Run(ctx, chromedp.Location()); err != nil || !strings.Contains(u, "consumer=consumer-dead") {
		t.Fatalf("after following consumer-dead: at %q (%v)", u, err)
	}
	if got := kinds(); len(got) != 2 || got[w.dead] != string(reaper.KindClaim) || got[w.charged] != string(reaper.KindAlreadyBilled) {
		t.Errorf("consumer-dead's entries: %v", got)
	}
}
