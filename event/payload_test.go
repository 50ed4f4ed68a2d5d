package event

import (
	"testing"
)

// The hand-built canonical payload must be byte for byte what json.Marshal
// produces, or billed entries lose the reaper's fast path (and, worse, a
// mismatch in the other direction could not happen: equality is the only
// thing trusted).
func TestPayloadIsMarshal(t *testing.T) {
	t.Parallel()
	for _, e := range []Event{
		{CustomerID: "c_42", BillingPeriod: "2026-11", StripeCustomerID: "cus_ABC", AmountCents: 2500, Currency: "usd"},
		{CustomerID: "a.b:c@d/e+f=g-h", BillingPeriod: "2026-W48", StripeCustomerID: "cus_1", AmountCents: 1, Currency: "eur"},
		// Characters JSON escapes take the slow path.
		{CustomerID: "x<y>&\"z", BillingPeriod: "2026-Q4", StripeCustomerID: "cus_é", AmountCents: 9, Currency: "usd"},
		{CustomerID: "tab\there", BillingPeriod: "back\\slash", StripeCustomerID: "\xff", AmountCents: -3},
		{},
	} {
		if got, want := e.Payload(), e.marshal(); got != want {
			t.Errorf("Payload %s, json.Marshal %s", got, want)
		}
	}
}

// QuickKey reads the key of every payload Payload writes, and of most
// others; where it cannot, it says so. Where it misreads (documented), Parse
// is what a caller must believe.
func TestQuickKey(t *testing.T) {
	t.Parallel()
	canonical := Event{CustomerID: "c_1", StripeCustomerID: "cus_1", AmountCents: 5, BillingPeriod: "2026-11", Currency: "usd"}.Payload()
	for _, c := range []struct {
		name         string
		payload      any // the field's value; nil: no payload field
		cust, period string
		ok           bool
		agrees       bool // Parse accepts it and reads the same key
	}{
		{"canonical", canonical, "c_1", "2026-11", true, true},
		{"reordered", `{"billing_period":"2026-12", "customer_id":"c_2","stripe_customer_id":"cus_2","amount_cents":1}`, "c_2", "2026-12", true, true},
		{"not json", `not json`, "", "", false, false},
		{"no period", `{"customer_id":"c_3"}`, "", "", false, false},
		{"empty period", `{"customer_id":"c_3","billing_period":""}`, "", "", false, false},
		{"not a string", []byte(canonical), "", "", false, false},
		{"no payload field", nil, "", "", false, false},
		// Misreads: the fast reading takes the first marker it sees, raw.
		{"escaped character", `{"customer_id":"c\u005f4","stripe_customer_id":"cus_4","amount_cents":1,"billing_period":"2026-11"}`,
			`c\u005f4`, "2026-11", true, false},
		{"nested period", `{"customer_id":"c_5","meta":{"x":1,"billing_period":"1999-01"},"stripe_customer_id":"cus_5","amount_cents":1,"billing_period":"2026-11"}`,
			"c_5", "1999-01", true, false},
	} {
		fields := map[string]any{}
		if c.payload != nil {
			fields[PayloadField] = c.payload
		}
		cust, period, ok := QuickKey(fields)
		if cust != c.cust || period != c.period || ok != c.ok {
			t.Errorf("%s: QuickKey = %q, %q, %v; want %q, %q, %v", c.name, cust, period, ok, c.cust, c.period, c.ok)
		}
		ev, err := ParseFields(fields, Rules{})
		if agrees := err == nil && ok && ev.CustomerID == cust && ev.BillingPeriod == period; agrees != c.agrees {
			t.Errorf("%s: QuickKey %q/%q agrees with Parse (%+v, %v): %v, want %v", c.name, cust, period, ev, err, agrees, c.agrees)
		}
	}
}
