package reaper

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/internal/ledger"
)

// quickKey is event.QuickKey (tested there, with the hand-built canonical
// payload it reads) as a ledger key.
func TestQuickKey(t *testing.T) {
	t.Parallel()
	for payload, want := range map[string]ledger.Key{
		`{"customer_id":"c_1","stripe_customer_id":"cus_1","amount_cents":5,"billing_period":"2026-11","currency":"usd"}`: {CustomerID: "c_1", BillingPeriod: "2026-11"},
		`{"billing_period":"2026-12", "customer_id":"c_2"}`:                                                               {CustomerID: "c_2", BillingPeriod: "2026-12"},
		`not json`:              {},
		`{"customer_id":"c_3"}`: {},
	} {
		got, ok := quickKey(redis.XMessage{Values: map[string]any{"payload": payload}})
		if got != want || ok != (want != ledger.Key{}) {
			t.Errorf("quickKey(%s) = %v, %v; want %v", payload, got, ok, want)
		}
	}
}
