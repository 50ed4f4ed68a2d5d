package stripeapi_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"

	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

// BenchmarkAdapterCharge charges through the adapter (payment_intents mode,
// pelguard metadata, unique idempotency keys) from parallel goroutines
// against the emulator with no latency. Goal: ≥ 5,000 charges/s.
func BenchmarkAdapterCharge(b *testing.B) {
	for _, mode := range modes {
		b.Run(string(mode), func(b *testing.B) {
			srv := newSim(b, stripesim.Config{})
			c := simClient(b, srv, stripeapi.Config{Mode: mode})
			var n atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				testenv.InParallel(b, perOp, 8, func() error {
					i := n.Add(1)
					_, err := c.Charge(b.Context(), pelguardReq(fmt.Sprintf("c_%d", i), "2026-11", 100))
					return err
				})
			}
			b.ReportMetric(float64(n.Load())/time.Since(start).Seconds(), "charges/s")
		})
	}
}

// BenchmarkAdapterListCharges streams 100k seeded charges through
// ListCharges (limit 100); one op is a full pass. "charges" are plain
// Charges API charges; "payment_intents" are made the way pelguard's default
// mode makes them, by an intent whose metadata Stripe copies onto the
// charge, which is what the auditor lists in production;
// "intent_metadata_only" is the fallback where only the intent has it and
// every page is fetched with the intent expanded. Goal: ≥ 50,000 charges/s.
//
// Each op also makes the same pass the way a team would with stripe-go
// alone (its iterator, expand[]=data.payment_intent, stripe.Charge), so the
// baseline sees the same machine load: stripe_go_charges/s and x_stripe_go.
func BenchmarkAdapterListCharges(b *testing.B) {
	for _, shape := range []struct {
		name             string
		viaIntent, omits bool
	}{
		{"payment_intents", true, false},
		{"charges", false, false},
		{"intent_metadata_only", true, true},
	} {
		b.Run(shape.name, func(b *testing.B) {
			const total = 100_000
			t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
			t1 := t0.Add(total * time.Second)
			srv := newSim(b, stripesim.Config{Now: t1, ChargeOmitsIntentMetadata: shape.omits})
			for i := range total {
				srv.SeedCharge(stripesim.ChargeSeed{
					Customer: fmt.Sprintf("cus_%d", i%1000), Amount: 100, Created: t0.Add(time.Duration(i) * time.Second),
					Metadata:  stripeapi.PelguardMetadata(fmt.Sprint(i%1000), "2026-11", fmt.Sprintf("k%d", i)),
					ViaIntent: shape.viaIntent,
				})
			}
			c := simClient(b, srv, stripeapi.Config{})
			sc := client.New(simKey, &stripe.Backends{API: stripe.GetBackendWithConfig(stripe.APIBackend,
				&stripe.BackendConfig{URL: stripe.String(srv.URL()), LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull}})})
			var took, baseTook time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				seen := 0
				err := c.ListCharges(b.Context(), t0, t1, func(ch stripeapi.Charge) error {
					if !stripeapi.IsPelguard(ch.Metadata) {
						return fmt.Errorf("charge %s lost its metadata", ch.ID)
					}
					seen++
					return nil
				})
				took += time.Since(start)
				if err != nil || seen != total {
					b.Fatalf("adapter saw %d of %d: %v", seen, total, err)
				}

				b.StopTimer()
				start = time.Now()
				p := &stripe.ChargeListParams{CreatedRange: &stripe.RangeQueryParams{GreaterThanOrEqual: t0.Unix(), LesserThan: t1.Unix()}}
				p.Limit = stripe.Int64(100)
				p.AddExpand("data.payment_intent")
				p.Context = b.Context()
				seen = 0
				for it := sc.Charges.List(p); it.Next(); {
					md := it.Charge().Metadata
					if len(md) == 0 && it.Charge().PaymentIntent != nil {
						md = it.Charge().PaymentIntent.Metadata
					}
					if !stripeapi.IsPelguard(md) {
						b.Fatalf("stripe-go: charge %s without metadata", it.Charge().ID)
					}
					seen++
				}
				baseTook += time.Since(start)
				if seen != total {
					b.Fatalf("stripe-go saw %d of %d", seen, total)
				}
				b.StartTimer()
			}
			rate := float64(total*b.N) / took.Seconds()
			base := float64(total*b.N) / baseTook.Seconds()
			b.ReportMetric(rate, "charges/s")
			b.ReportMetric(base, "stripe_go_charges/s")
			b.ReportMetric(rate/base, "x_stripe_go")
		})
	}
}

// perOp is how many charges one benchmark op makes, so that `-benchtime 1x`
// (what make bench uses for every benchmark) still measures thousands.
const perOp = 3000
