package console

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/reaper"
)

// TestScreenshotPEL writes the docs' screenshot of the PEL page (the
// entries of TestPELVerdictsEqualReaperDryRun, a dry-run pass recorded)
// and of the live part of the overview when PELGUARD_CONSOLE_PEL_SCREENSHOT
// and PELGUARD_CONSOLE_LIVE_SCREENSHOT name the PNGs to write:
//
//	PELGUARD_CONSOLE_PEL_SCREENSHOT=$PWD/docs/console-pel.png \
//	PELGUARD_CONSOLE_LIVE_SCREENSHOT=$PWD/docs/console-live.png go test -run TestScreenshotPEL ./internal/console
func TestScreenshotPEL(t *testing.T) {
	pel, live := os.Getenv("PELGUARD_CONSOLE_PEL_SCREENSHOT"), os.Getenv("PELGUARD_CONSOLE_LIVE_SCREENSHOT")
	if pel == "" && live == "" {
		t.Skip("set PELGUARD_CONSOLE_PEL_SCREENSHOT=FILE.png (and PELGUARD_CONSOLE_LIVE_SCREENSHOT) to write the docs' screenshots")
	}
	b := setup(t, func(c *Config) { c.Reaper.MinIdle = time.Millisecond; c.Refresh = -1 })
	b.seedPEL(t)
	ctx := context.Background()
	// Stats as a running consumer publishes them.
	for name, per := range map[string]string{"consumer-live": `{"events":18420,"per_s":41.3}`, "consumer-dead": `{"events":5120,"per_s":0}`} {
		k := consumer.StatsKey(b.stream, b.group, name)
		if err := b.rdb.Set(ctx, k, per, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	r, err := reaper.New(reaper.Config{Redis: b.rdb, DB: b.cfg.DB, Schema: b.cfg.Schema, DryRun: true, MinIdle: time.Millisecond,
		Name: "reaper-7c9d", Streams: []reaper.StreamGroup{{Stream: b.stream, Group: b.group}}, Clock: b.clk})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	bctx := browser(t, 1280, 900)
	if err := chromedp.Do(bctx, b.browserLogin("alice")...); err != nil {
		t.Fatal(err)
	}
	shoot := func(path, sel, out string) {
		if out == "" {
			return
		}
		if err := chromedp.Do(bctx, chromedp.Navigate(b.srv.URL+path), chromedp.WaitVisible(chromedp.CSS(sel))); err != nil {
			t.Fatal(err)
		}
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(out, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	shoot("/pel?stream="+b.stream, "table.pel", pel)
	shoot("/", "#live-consumers", live)
}
