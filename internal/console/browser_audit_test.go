package console

import (
	"context"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The overview's auditor table reads whole at a phone's width (375 px) and
// at desktop widths: every column inside its card, nothing cut off behind
// a scroll bar, and the page itself never wider than the screen. Measured
// in a real Chromium.
func TestBrowserAuditorTableReadsWhole(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	// Runs as the table shows them: a manual one, a failed one with a long
	// error, a running one.
	for i, q := range []string{
		`INSERT INTO {schema}.audit_runs (started_at, finished_at, window_from, window_to, status, charges_scanned, findings_new, findings_resolved, manual)
			VALUES ($1, $1::timestamptz + interval '2.5 seconds', $1::timestamptz - interval '1 day', $1, 'ok', 1234567, 12, 3, true)`,
		`INSERT INTO {schema}.audit_runs (started_at, finished_at, window_from, window_to, status, charges_scanned, findings_new, findings_resolved, error)
			VALUES ($1, $1::timestamptz + interval '61 seconds', $1::timestamptz - interval '1 day', $1, 'failed', 98765, 0, 0,
			'listing charges: stripe: request failed after 3 retries: Get "https://api.stripe.com/v1/charges?created[gte]=1764460800&limit=100": context deadline exceeded')`,
		`INSERT INTO {schema}.audit_runs (started_at, window_from, window_to, status, charges_scanned, findings_new, findings_resolved)
			VALUES ($1, $1::timestamptz - interval '1 day', $1, 'running', 0, 0, 0)`,
	} {
		if _, err := b.pool.Exec(ctx, q, now.Add(-time.Duration(3-i)*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	for _, width := range []int{375, 768, 1024, 1280, 1920} {
		bctx := browser(t, width, 900)
		if err := chromedp.Do(bctx, b.browserLogin("alice")...); err != nil {
			t.Fatal(err)
		}
		// Chromium's window is at least 500 px wide: a phone is emulated.
		if err := chromedp.Do(bctx, chromedp.EmulateViewport(int64(width), 900), chromedp.Navigate(b.srv.URL+"/?refresh=0"),
			chromedp.WaitVisible(chromedp.CSS("#live-audit table"))); err != nil {
			t.Fatal(err)
		}
		m, err := chromedp.Run(bctx, chromedp.Evaluate[map[string]float64](`(() => {
			const card = document.querySelector('#live-audit'), box = card.querySelector('.scroll'), table = box.querySelector('table');
			const cr = card.getBoundingClientRect();
			let outside = 0;
			for (const c of table.querySelectorAll('th, td')) {
				const r = c.getBoundingClientRect();
				if (r.width === 0 && r.height === 0) continue; // not displayed (the header row on a phone)
				if (r.right > cr.right + 0.5 || r.left < cr.left - 0.5 || c.scrollWidth > c.clientWidth + 1) outside++;
			}
			return {page: document.documentElement.scrollWidth, screen: document.documentElement.clientWidth,
				box: box.clientWidth, table: table.scrollWidth, outside: outside, cells: table.querySelectorAll('td').length};
		})()`))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%d px: %v", width, m)
		if m["page"] > m["screen"]+1 {
			t.Errorf("%d px: the overview is %v px wide", width, m["page"])
		}
		if m["table"] > m["box"]+1 || m["outside"] > 0 {
			t.Errorf("%d px: the auditor table is %v px in a %v px card, %v cells cut off", width, m["table"], m["box"], m["outside"])
		}
		if m["screen"] != float64(width) {
			t.Errorf("the screen is %v px, want %d", m["screen"], width)
		}
		if m["cells"] < 18 {
			t.Errorf("%d px: %v cells, want the 3 runs' 18", width, m["cells"])
		}
	}
}
