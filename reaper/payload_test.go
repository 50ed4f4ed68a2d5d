package reaper

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/internal/ledger"
)

// The hand-built canonical payload must be byte for byte what
// event.Event.Payload produces, or billed entries lose the fast path (and,
// worse, a mismatch in the other direction could not happen: equality is
// the only thing trusted).
func TestRowPayloadIsEventPayload(t *testing.T) {
	t.Parallel()
	for _, rec := range []ledger.Record{
		{Key: ledger.Key{CustomerID: "c_42", BillingPeriod: "2026-11"}, StripeCustomerID: "cus_ABC", AmountCents: 2500, Currency: "usd"},
		{Key: ledger.Key{CustomerID: "a.b:c@d/e+f=g-h", BillingPeriod: "2026-W48"}, StripeCustomerID: "cus_1", AmountCents: 1, Currency: "eur"},
		{Key: ledger.Key{CustomerID: "x<y>&\"z", BillingPeriod: "2026-Q4"}, StripeCustomerID: "cus_é", AmountCents: 9, Currency: "usd"},
	} {
		if got, want := rowPayload(rec), rowEvent(rec).Payload(); got != want {
			t.Errorf("rowPayload %s, Payload %s", got, want)
		}
	}
}

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
