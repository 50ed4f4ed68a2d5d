package event

import (
	"errors"
	"testing"
)

// FuzzParse proves the parser never panics and that whatever it accepts is
// valid by its own rules. Run: go test -fuzz FuzzParse ./event/
func FuzzParse(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte(`{"amount_cents":-0}`))
	f.Add([]byte(`{"customer_id":"c","stripe_customer_id":"cus_A","amount_cents":1e400,"billing_period":"2026-11"}`))
	f.Add([]byte(`{"a":{"b":[1,2,{"c":null}]}}`))
	f.Add([]byte(`"x"`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		ev, err := Parse(payload, Rules{})
		if err != nil {
			if !errors.Is(err, ErrInvalid) || Reason(err) == "" {
				t.Fatalf("error without a reason: %v", err)
			}
			return
		}
		if ev.AmountCents <= 0 || ev.AmountCents > DefaultMaxAmountCents || ev.CustomerID == "" ||
			ev.BillingPeriod == "" || len(ev.Currency) != 3 {
			t.Fatalf("accepted an invalid event: %+v", ev)
		}
		if _, err := Parse([]byte(ev.Payload()), Rules{}); err != nil {
			t.Fatalf("re-encoded event rejected: %v", err)
		}
	})
}
