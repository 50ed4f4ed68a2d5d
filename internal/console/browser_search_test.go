package console

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// The walk, in a real Chromium: the overview, the header's search
// box, a customer's period — checked against the ledger row — a search of
// several places, one of nothing, and a dead letter's page on a phone (no
// sideways scroll, the Replay button on one line). With
// PELGUARD_CONSOLE_SEARCH_SCREENSHOTS=DIR it writes DIR/console-search.png
// (a result list) and DIR/console-customer.png (a customer's period):
//
//	PELGUARD_CONSOLE_SEARCH_SCREENSHOTS=$PWD/docs go test -run TestBrowserSearchWalk ./internal/console
func TestBrowserSearchWalk(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	w := b.searchWorld(t)
	ctx := browser(t, 1280, 900)
	shots := os.Getenv("PELGUARD_CONSOLE_SEARCH_SCREENSHOTS")
	shoot := func(name string) {
		t.Helper()
		if shots == "" {
			return
		}
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(shots, name), png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s (%d bytes)", name, len(png))
	}
	search := func(q string, wait string) {
		t.Helper()
		// Mark this document, so the wait below is for the next one: the
		// element waited for may be on this page too.
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(window.pelguardLeaving = true) &&
			(document.querySelector('header input[name=q]').value = '') === ''`)); err != nil {
			t.Fatal(err)
		}
		if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS(`header input[name=q]`), q+kb.Enter)); err != nil {
			t.Fatalf("searching %q: %v", q, err)
		}
		// The next document, loaded (an evaluation during the navigation
		// fails: try again).
		deadline := time.Now().Add(30 * time.Second)
		for {
			loaded, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.pelguardLeaving === undefined && document.readyState === 'complete'`))
			if err == nil && loaded {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("searching %q: no new page after 30 s (%v)", q, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(wait))); err != nil {
			t.Fatalf("searching %q: %v", q, err)
		}
	}
	if err := chromedp.Do(ctx, b.browserLogin("alice")...); err != nil {
		t.Fatal(err)
	}
	if over := text(t, ctx, "main"); !strings.Contains(over, "Events by outcome") {
		t.Fatalf("overview: %q", over)
	}

	// A duplicate charge's id: c1's period, as the ledger holds it.
	search(w.dup, "#row-status")
	row, err := getLedgerRow(context.Background(), b.pool, "c1", testPeriod)
	if err != nil || row == nil {
		t.Fatalf("ledger row: %v %v", row, err)
	}
	loc, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	if want := b.srv.URL + customerURL("c1", testPeriod); loc != want {
		t.Errorf("landed on %s, want %s", loc, want)
	}
	for css, want := range map[string]string{"#row-status": string(row.Status), "#row-amount": money(row.AmountCents, row.Currency),
		"#row-charge": row.ChargeID, "h2": "c1 · " + testPeriod} {
		if got := strings.TrimSpace(text(t, ctx, css)); got != want {
			t.Errorf("%s shows %q, the ledger %q", css, got, want)
		}
	}
	main := text(t, ctx, "main")
	for _, want := range []string{w.dup, "succeeded", "duplicate_charge", "no dead letter of this customer"} {
		if !strings.Contains(main, want) {
			t.Errorf("c1's period page lacks %q", want)
		}
	}
	shoot("console-customer.png")

	// A Stripe customer of two ledger customers: a list; its second entry
	// leads to cb's latest period.
	search("cus_shared", "#search-hits")
	if got := text(t, ctx, "#search-count"); !strings.HasPrefix(got, "2 places match") {
		t.Errorf("the list says %q", got)
	}
	shoot("console-search.png")
	if err := chromedp.Do(ctx, chromedp.Click(`//table[@id="search-hits"]//a[text()="cb"]`), chromedp.WaitVisible(chromedp.CSS("#row-amount"))); err != nil {
		t.Fatal(err)
	}
	cb, err := getLedgerRow(context.Background(), b.pool, "cb", testPeriod)
	if err != nil || cb == nil {
		t.Fatal(err)
	}
	if got := text(t, ctx, "#row-amount"); got != money(cb.AmountCents, cb.Currency) {
		t.Errorf("cb's amount %q, the ledger %q", got, money(cb.AmountCents, cb.Currency))
	}

	// Nothing: said, and the box keeps the query.
	search("ch_nothing_here", "#search-none")
	kept, err := chromedp.Run(ctx, chromedp.Value(chromedp.CSS(`header input[name=q]`)))
	if err != nil {
		t.Fatal(err)
	}
	if kept != "ch_nothing_here" {
		t.Errorf("the search box holds %q after finding nothing", kept)
	}

	// On a phone: a dead letter's id leads to c9's period; nothing scrolls
	// sideways and the Replay button is one line.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(390, 844)); err != nil {
		t.Fatal(err)
	}
	search(w.deadID, "#dead-letters")
	if dead := text(t, ctx, "#dead-letters"); !strings.Contains(dead, "1500 JPY") || !strings.Contains(dead, w.deadID) {
		t.Errorf("c9's dead letters: %q", dead)
	}
	lines, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`(() => { const a = document.querySelector('#dead-letters a.button');
		return a.getBoundingClientRect().height / parseFloat(getComputedStyle(a).fontSize); })()`))
	if err != nil {
		t.Fatal(err)
	}
	if lines > 3 { // one line and its padding is about 2.3 font sizes, two lines 3.8
		t.Errorf("the Replay button wraps: %.1f font sizes high", lines)
	}
	for _, q := range []string{"cus_shared", w.deadID} {
		search(q, "h1")
		widths, err := chromedp.Run(ctx, chromedp.Evaluate[[]int](`[document.documentElement.scrollWidth, document.documentElement.clientWidth]`))
		if err != nil {
			t.Fatal(err)
		}
		if widths[0] > widths[1]+1 {
			t.Errorf("searching %s: the page is %d px wide on a %d px screen", q, widths[0], widths[1])
		}
	}
}
