package event

import (
	"errors"
	"testing"
)

// FuzzParse proves the parser never panics and that whatever it accepts is
// valid by its own rules; and that the shortcuts the reaper takes agree with
// it: Payload is json.Marshal's output and parses back to the same event
// (the reaper trusts a payload equal to a row's Payload without parsing
// it), and QuickKey reads the key of any such payload. Run:
// go test -fuzz FuzzParse ./event/
func FuzzParse(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte(`{"amount_cents":-0}`))
	f.Add([]byte(`{"customer_id":"c","stripe_customer_id":"cus_A","amount_cents":1e400,"billing_period":"2026-11"}`))
	f.Add([]byte(`{"a":{"b":[1,2,{"c":null}]}}`))
	f.Add([]byte(`"x"`))
	f.Add([]byte(`{"customer_id":"c\u005f4","stripe_customer_id":"cus_4","amount_cents":1,"billing_period":"2026-11"}`))
	f.Add([]byte(`{"customer_id":"c_5","m":{"billing_period":"1999-01"},"stripe_customer_id":"cus_5","amount_cents":1,"billing_period":"2026-11"}`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		if cust, period, ok := QuickKey(map[string]any{PayloadField: string(payload)}); ok && (cust == "" || period == "") {
			t.Fatalf("QuickKey ok with an empty key: %q, %q", cust, period)
		}
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
		canon := ev.Payload()
		if want := ev.marshal(); canon != want {
			t.Fatalf("Payload %s, json.Marshal %s", canon, want)
		}
		if back, err := Parse([]byte(canon), Rules{}); err != nil || back != ev {
			t.Fatalf("re-encoded event %s parsed as %+v, %v; want %+v", canon, back, err, ev)
		}
		cust, period, ok := QuickKey(map[string]any{PayloadField: canon})
		if !ok || cust != ev.CustomerID || period != ev.BillingPeriod {
			t.Fatalf("QuickKey(%s) = %q, %q, %v", canon, cust, period, ok)
		}
	})
}

// FuzzPayload holds Payload to json.Marshal for any field values, not only
// valid ones: the hand-built form must never differ from the marshalled one.
// Run: go test -fuzz FuzzPayload ./event/
func FuzzPayload(f *testing.F) {
	f.Add("c_42", "cus_ABC", int64(2500), "2026-11", "usd")
	f.Add("x<y>&\"z", "cus_é", int64(-1), "\t", "\xff")
	f.Fuzz(func(t *testing.T, cust, stripeCust string, amount int64, period, currency string) {
		e := Event{CustomerID: cust, StripeCustomerID: stripeCust, AmountCents: amount, BillingPeriod: period, Currency: currency}
		if got, want := e.Payload(), e.marshal(); got != want {
			t.Fatalf("Payload %s, json.Marshal %s", got, want)
		}
	})
}
