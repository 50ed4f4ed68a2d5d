package console

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// BenchmarkPages is each page's server time with 1,000,000 ledger rows and
// 100,000 findings (issue 20 wants under 200 ms), Stripe excluded (the
// console has no Stripe client here, so no charge is re-read). Seeding
// takes a minute or two and is not timed:
//
//	go test -run '^$' -bench BenchmarkPages -benchtime 20x ./internal/console
func BenchmarkPages(b *testing.B) {
	w := setup(b, func(c *Config) { c.Stripe = nil })
	w.seedBig(b, 1_000_000, 100_000)
	sid, err := w.console.auth.store.create(context.Background(), "alice", "", now, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	pages := []struct{ name, path string }{
		{"overview", "/"},
		{"findings_open", "/findings?state=open"},
		{"findings_open_page_100", "/findings?state=open&before=50000"},
		{"findings_kind", "/findings?kind=disputed"},
		{"findings_customer", "/findings?customer=b17"},
		{"finding", "/findings/4242"},
		{"customer", "/customer?customer=b17&period=2025-06"},
		{"dead_letters", "/dead"},
		{"actions", "/actions"},
	}
	for _, p := range pages {
		b.Run(p.name, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodGet, p.path, nil)
			req.AddCookie(&http.Cookie{Name: sessionCookie, Value: sid})
			for b.Loop() {
				rec := httptest.NewRecorder()
				w.console.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					b.Fatal(fmt.Sprintf("%s: %d %s", p.path, rec.Code, rec.Body.String()))
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/page")
		})
	}
}
