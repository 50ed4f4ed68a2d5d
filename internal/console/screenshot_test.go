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
