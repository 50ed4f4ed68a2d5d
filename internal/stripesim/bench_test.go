package stripesim

import (
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v76"

	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// BenchmarkChargeCreate creates charges through stripe-go from parallel
// goroutines, each with a unique idempotency key, and reports charges/s.
func BenchmarkChargeCreate(b *testing.B) {
	srv, sc := setup(b, Config{})
	var n atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		testenv.InParallel(b, perOp, 8, func() error {
			i := n.Add(1)
			_, err := sc.Charges.New(newChargeParams("cus_bench", 100, fmt.Sprintf("bench-%d", i)))
			return err
		})
	}
	b.ReportMetric(float64(n.Load())/time.Since(start).Seconds(), "charges/s")
	if srv.ChargeCreates() != n.Load() {
		b.Fatalf("creates %d != %d", srv.ChargeCreates(), n.Load())
	}
}

// BenchmarkListCharges auto-paginates (limit 100) over 100k seeded charges;
// one op is a full pass. Reports charges/s.
func BenchmarkListCharges(b *testing.B) {
	const total = 100_000
	srv, sc := setup(b, Config{})
	for i := range total {
		srv.SeedCharge(ChargeSeed{
			Customer: fmt.Sprintf("cus_%d", i%1000), Amount: 100,
			Created:  t0.Add(time.Duration(i) * time.Second),
			Metadata: map[string]string{"customer_id": fmt.Sprint(i % 1000), "billing_period": "2024-04"},
		})
	}
	b.ResetTimer()
	start := time.Now()
	seen := 0
	for range b.N {
		params := &stripe.ChargeListParams{}
		params.Limit = stripe.Int64(100)
		it := sc.Charges.List(params)
		for it.Next() {
			seen++
		}
		if err := it.Err(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(seen)/time.Since(start).Seconds(), "charges/s")
	if seen != total*b.N {
		b.Fatalf("saw %d", seen)
	}
}

// BenchmarkListChargesServerOnly pages over the same 100k charges with plain
// net/http, reading but not decoding bodies: the emulator's own cost,
// without stripe-go's JSON decoding (which dominates the benchmark above).
func BenchmarkListChargesServerOnly(b *testing.B) {
	const total = 100_000
	srv, _ := setup(b, Config{})
	var last string
	for i := range total {
		last = srv.SeedCharge(ChargeSeed{Customer: "cus_x", Amount: 100, Created: t0.Add(time.Duration(i) * time.Second)}).ID
	}
	_ = last
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	all := srv.Charges()
	b.ResetTimer()
	start := time.Now()
	seen := 0
	for range b.N {
		cursor := ""
		for {
			u := srv.URL() + "/v1/charges?limit=100"
			if cursor != "" {
				u += "&starting_after=" + cursor
			}
			req, _ := http.NewRequest(http.MethodGet, u, nil)
			req.Header.Set("Authorization", "Bearer "+testKey)
			resp, err := hc.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			seen += 100
			// Cursor arithmetic instead of decoding: the page ends 100
			// charges further back in creation order.
			idx := total - seen
			if idx <= 0 {
				break
			}
			cursor = all[idx].ID
		}
	}
	b.ReportMetric(float64(seen)/time.Since(start).Seconds(), "charges/s")
}

// perOp is how many charges one benchmark op makes, so that `-benchtime 1x`
// (what make bench uses for every benchmark) still measures thousands.
const perOp = 3000
