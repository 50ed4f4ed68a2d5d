package console

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// BenchmarkSearch is the search box's server time, and the customer page
// it lands on, with 1,000,000 ledger rows, 100,000 findings and 10,000
// dead letters (the customer page reads up to DeadLetterScan of them for
// the customer's), Stripe excluded. Seeding takes a minute or two and is
// not timed:
//
//	go test -run '^$' -bench BenchmarkSearch -benchtime 20x ./internal/console
func BenchmarkSearch(b *testing.B) {
	w := setup(b, func(c *Config) { c.Stripe = nil })
	w.seedBig(b, 1_000_000, 100_000)
	ctx := context.Background()
	sid, err := w.console.auth.store.create(ctx, "alice", "", now, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	run := func(name, path string, code int) {
		b.Run(name, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodGet, path, nil)
			req.AddCookie(&http.Cookie{Name: sessionCookie, Value: sid})
			for b.Loop() {
				rec := httptest.NewRecorder()
				w.console.ServeHTTP(rec, req)
				if rec.Code != code {
					b.Fatalf("%s: %d, want %d: %s", path, rec.Code, code, rec.Body.String())
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/page")
		})
	}
	// The baseline: the same customer page before any dead letter exists.
	run("customer_page_no_dead_letters", "/customer?customer=b17&period=2025-06", http.StatusOK)
	pipe := w.rdb.Pipeline()
	for i := range 10_000 {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: w.stream + ":dead", Values: map[string]any{"reason": "spend_cap", "source_id": "1-1",
			"payload": fmt.Sprintf(`{"customer_id":"b%d","billing_period":"2025-06","amount_cents":2500}`, i)}})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		b.Fatal(err)
	}
	pages := []struct {
		name, path string
		code       int
	}{
		{"customer_id", "/search?q=b17", http.StatusSeeOther},
		{"stripe_customer", "/search?q=cus_b17", http.StatusSeeOther},
		{"charge", "/search?q=ch_b424242", http.StatusSeeOther},
		{"finding_charge", "/search?q=ch_f4242", http.StatusSeeOther},
		{"stream_entry", "/search?q=1700000424242-0", http.StatusSeeOther},
		{"period", "/search?q=2025-06", http.StatusOK},
		{"nothing", "/search?q=ch_nothing", http.StatusNotFound},
		{"customer_page_with_dead_letters", "/customer?customer=b17&period=2025-06", http.StatusOK},
	}
	for _, p := range pages {
		run(p.name, p.path, p.code)
	}
}
