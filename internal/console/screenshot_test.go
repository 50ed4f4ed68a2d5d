package console

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/stripeapi"
)

// TestScreenshot writes the README's screenshot of the overview when
// PELGUARD_CONSOLE_SCREENSHOT names the PNG to write:
//
//	PELGUARD_CONSOLE_SCREENSHOT=$PWD/docs/console.png go test -run TestScreenshot ./internal/console
func TestScreenshot(t *testing.T) {
	out := os.Getenv("PELGUARD_CONSOLE_SCREENSHOT")
	if out == "" {
		t.Skip("set PELGUARD_CONSOLE_SCREENSHOT=FILE.png to write the README's screenshot")
	}
	b := setup(t, nil)
	ctx := context.Background()
	var recs []ledger.Record
	for i := range 48 {
		cust := fmt.Sprintf("c%d", i)
		r := ledger.Record{Key: ledger.Key{CustomerID: cust, BillingPeriod: testPeriod}, StripeCustomerID: "cus_" + cust,
			AmountCents: int64(1500 + 125*i), Currency: "usd", IdempotencyKey: key(cust), FirstAttemptAt: w0, ChargedAt: w0.Add(2 * time.Hour)}
		meta := stripeapi.PelguardMetadata(cust, testPeriod, key(cust))
		switch {
		case i%13 == 5:
			r.Status = ledger.StatusDeclined
		case i%17 == 3:
			r.Status = ledger.StatusPending
		default:
			r.ChargeID = b.sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_" + cust, Amount: r.AmountCents, Created: w0.Add(2 * time.Hour), Metadata: meta}).ID
			if i%11 == 0 { // a second charge: a duplicate the audit finds
				b.sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_" + cust, Amount: r.AmountCents, Created: w0.Add(3 * time.Hour), Metadata: meta})
			}
		}
		recs = append(recs, r)
	}
	if _, err := b.ledger.SeedForTest(ctx, recs); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.SetCap(ctx, testPeriod, 120_000); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE {schema}.spend_caps SET reserved_cents = 97500`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.auditor.Run(ctx, audit.Window{From: w0, To: w1}); err != nil {
		t.Fatal(err)
	}
	if err := b.rdb.XGroupCreateMkStream(ctx, b.stream, b.group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	for i, reason := range []string{"spend_cap", "spend_cap", "invalid_amount"} {
		b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream + ":dead", Values: map[string]any{"reason": reason, "source_id": fmt.Sprintf("1-%d", i),
			"payload": fmt.Sprintf(`{"customer_id":"c%d","billing_period":"2026-11","amount_cents":2500}`, 60+i)}})
	}
	b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: map[string]any{"payload": `{"customer_id":"c3"}`}})
	b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: b.group, Consumer: "worker-1", Streams: []string{b.stream, ">"}, Count: 1})

	bctx := browser(t, 1280, 900)
	if err := chromedp.Do(bctx, b.browserLogin("alice")...); err != nil {
		t.Fatal(err)
	}
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s (%d bytes)", out, len(png))
}

// TestScreenshotLedger writes docs/operations/console.md's screenshot of
// the Ledger page (a rollback under repair, an older one repaired) when
// PELGUARD_CONSOLE_LEDGER_SCREENSHOT names the PNG to write:
//
//	PELGUARD_CONSOLE_LEDGER_SCREENSHOT=$PWD/docs/console-ledger.png go test -run TestScreenshotLedger ./internal/console
func TestScreenshotLedger(t *testing.T) {
	out := os.Getenv("PELGUARD_CONSOLE_LEDGER_SCREENSHOT")
	if out == "" {
		t.Skip("set PELGUARD_CONSOLE_LEDGER_SCREENSHOT=FILE.png to write the Ledger page's screenshot")
	}
	b := setup(t, nil)
	for i, w := range []struct {
		name string
		seq  int64
		idle time.Duration
	}{
		{"consumer@billing-7f9c6-x2k8q", 48213, 2 * time.Second},
		{"consumer@billing-7f9c6-m4tz1", 47990, 3 * time.Second},
		{"reaper@billing-reaper-0", 1204, 40 * time.Second},
		{"webhooks@billing-webhooks-1", 3310, 5 * time.Second},
		{"auditor@billing-auditor-0", 96, 20 * time.Minute},
		{"console@ops-1", 4, 26 * time.Hour},
	} {
		b.witness(t, w.name, w.seq+int64(i), now.Add(-w.idle))
	}
	old := now.Add(-9 * 24 * time.Hour)
	b.rollback(t, rollbackRow{DetectedAt: old, DetectedBy: "reaper@billing-reaper-0",
		Evidence:  "consumer@billing-7f9c6-x2k8q: ledger at 30117, witnessed 30152 (35 commits lost); reaper@billing-reaper-0: ledger at 811, witnessed 813 (2 commits lost)",
		LostSince: old.Add(-6 * time.Minute), EpochFloor: 1 << 32, RowsFenced: 17, RepairStarted: ptr(old.Add(3 * time.Second)),
		Repaired: ptr(old.Add(41 * time.Second)), RepairedBy: "auditor@billing-auditor-0", RowsRebuilt: 35, RowsRepaired: 9, RefundsRebuilt: 1, Findings: 1,
		Report: "35 charged rows rebuilt from Stripe; 9 rows taken back to pending recorded as charged; 1 refund rebuilt into refund_ledger\n1 finding: c_812/2026-11 has only a fully refunded charge at Stripe"})
	detected := now.Add(-50 * time.Second)
	b.rollback(t, rollbackRow{DetectedAt: detected, DetectedBy: "consumer@billing-7f9c6-m4tz1",
		Evidence:  "consumer@billing-7f9c6-m4tz1: ledger at 47921, witnessed 47990 (69 commits lost); webhooks@billing-webhooks-1: ledger at 3302, witnessed 3310 (8 commits lost)",
		LostSince: detected.Add(-7 * time.Minute), EpochFloor: 2 << 32, RowsFenced: 23, RepairStarted: ptr(now.Add(-12 * time.Second)),
		RepairedBy: "auditor@billing-auditor-0"})

	if _, err := b.pool.Exec(context.Background(), `UPDATE {schema}.ledger_fence SET epoch_floor = $1`, int64(2<<32)); err != nil {
		t.Fatal(err)
	}
	bctx := browser(t, 1280, 900)
	if err := chromedp.Do(bctx, b.browserLogin("alice")...); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(bctx, chromedp.Navigate(b.srv.URL+"/ledger"), chromedp.WaitVisible(`//h1[text()="Ledger"]`)); err != nil {
		t.Fatal(err)
	}
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s (%d bytes)", out, len(png))
}
