package event

import (
	"errors"
	"strings"
	"testing"
	"time"
)

const good = `{"customer_id":"c_42","stripe_customer_id":"cus_ABC","amount_cents":2500,"billing_period":"2026-11","currency":"usd"}`

func TestParseGood(t *testing.T) {
	t.Parallel()
	ev, err := Parse([]byte(good), Rules{})
	if err != nil {
		t.Fatal(err)
	}
	want := Event{CustomerID: "c_42", StripeCustomerID: "cus_ABC", AmountCents: 2500, BillingPeriod: "2026-11", Currency: "usd"}
	if ev != want {
		t.Fatalf("got %+v, want %+v", ev, want)
	}
	// currency is optional and defaults to usd.
	ev, err = Parse([]byte(`{"customer_id":"c_1","stripe_customer_id":"cus_X","amount_cents":1,"billing_period":"2026-W48"}`), Rules{})
	if err != nil || ev.Currency != "usd" {
		t.Fatalf("default currency: %+v %v", ev, err)
	}
	// unknown fields are ignored by default (documented) ...
	if _, err := Parse([]byte(`{"customer_id":"c_1","stripe_customer_id":"cus_X","amount_cents":1,"billing_period":"2026-11","source":"api"}`), Rules{}); err != nil {
		t.Fatalf("unknown field should be ignored by default: %v", err)
	}
	// ... and round-trips through Payload.
	ev2, err := Parse([]byte(want.Payload()), Rules{})
	if err != nil || ev2 != want {
		t.Fatalf("Payload round trip: %+v %v", ev2, err)
	}
}

func TestParseRejects(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		payload string
		rules   Rules
		reason  string
		field   string
	}{
		{"not json", `charge c_42 2500`, Rules{}, ReasonNotJSON, ""},
		{"truncated json", `{"customer_id":"c_42"`, Rules{}, ReasonNotJSON, ""},
		{"array", `[1,2]`, Rules{}, ReasonNotObject, ""},
		{"empty", `   `, Rules{}, ReasonMissingPayload, "payload"},
		{"trailing data", good + `{}`, Rules{}, ReasonNotJSON, ""},
		{"missing customer", `{"stripe_customer_id":"cus_ABC","amount_cents":2500,"billing_period":"2026-11"}`, Rules{}, ReasonMissingField, "customer_id"},
		{"missing stripe customer", `{"customer_id":"c_42","amount_cents":2500,"billing_period":"2026-11"}`, Rules{}, ReasonMissingField, "stripe_customer_id"},
		{"missing amount", `{"customer_id":"c_42","stripe_customer_id":"cus_ABC","billing_period":"2026-11"}`, Rules{}, ReasonMissingField, "amount_cents"},
		{"missing period", `{"customer_id":"c_42","stripe_customer_id":"cus_ABC","amount_cents":2500}`, Rules{}, ReasonMissingField, "billing_period"},
		{"null amount", `{"customer_id":"c_42","stripe_customer_id":"cus_ABC","amount_cents":null,"billing_period":"2026-11"}`, Rules{}, ReasonMissingField, "amount_cents"},
		{"empty customer", `{"customer_id":"  ","stripe_customer_id":"cus_ABC","amount_cents":2500,"billing_period":"2026-11"}`, Rules{}, ReasonEmptyField, "customer_id"},
		{"empty period", `{"customer_id":"c","stripe_customer_id":"cus_ABC","amount_cents":2500,"billing_period":""}`, Rules{}, ReasonEmptyField, "billing_period"},
		{"zero amount", `{"customer_id":"c","stripe_customer_id":"cus_ABC","amount_cents":0,"billing_period":"2026-11"}`, Rules{}, ReasonAmountTooSmall, "amount_cents"},
		{"negative amount", `{"customer_id":"c","stripe_customer_id":"cus_ABC","amount_cents":-2500,"billing_period":"2026-11"}`, Rules{}, ReasonAmountTooSmall, "amount_cents"},
		{"float amount", `{"customer_id":"c","stripe_customer_id":"cus_ABC","amount_cents":25.00,"billing_period":"2026-11"}`, Rules{}, ReasonBadAmount, "amount_cents"},
		{"exponent amount", `{"customer_id":"c","stripe_customer_id":"cus_ABC","amount_cents":2.5e3,"billing_period":"2026-11"}`, Rules{}, ReasonBadAmount, "amount_cents"},
		{"string amount", `{"customer_id":"c","stripe_customer_id":"cus_ABC","amount_cents":"2500","billing_period":"2026-11"}`, Rules{}, ReasonBadFieldType, "amount_cents"},
		{"bool amount", `{"customer_id":"c","stripe_customer_id":"cus_ABC","amount_cents":true,"billing_period":"2026-11"}`, Rules{}, ReasonBadFieldType, "amount_cents"},
		{"huge amount", `{"customer_id":"c","stripe_customer_id":"cus_ABC","amount_cents":99999999999999999999999,"billing_period":"2026-11"}`, Rules{}, ReasonAmountTooLarge, "amount_cents"},
		{"amount over max", `{"customer_id":"c","stripe_customer_id":"cus_ABC","amount_cents":5001,"billing_period":"2026-11"}`, Rules{MaxAmountCents: 5000}, ReasonAmountTooLarge, "amount_cents"},
		{"bad currency", `{"customer_id":"c","stripe_customer_id":"cus_ABC","amount_cents":1,"billing_period":"2026-11","currency":"dollars"}`, Rules{}, ReasonBadCurrency, "currency"},
		{"uppercase currency", `{"customer_id":"c","stripe_customer_id":"cus_ABC","amount_cents":1,"billing_period":"2026-11","currency":"USD"}`, Rules{}, ReasonBadCurrency, "currency"},
		{"numeric currency", `{"customer_id":"c","stripe_customer_id":"cus_ABC","amount_cents":1,"billing_period":"2026-11","currency":840}`, Rules{}, ReasonBadFieldType, "currency"},
		{"bad period", `{"customer_id":"c","stripe_customer_id":"cus_ABC","amount_cents":1,"billing_period":"November"}`, Rules{}, ReasonBadPeriod, "billing_period"},
		{"bad stripe customer", `{"customer_id":"c","stripe_customer_id":"acct_1","amount_cents":1,"billing_period":"2026-11"}`, Rules{}, ReasonBadStripeCust, "stripe_customer_id"},
		{"customer with spaces", `{"customer_id":"c 42","stripe_customer_id":"cus_ABC","amount_cents":1,"billing_period":"2026-11"}`, Rules{}, ReasonBadIdentifier, "customer_id"},
		{"numeric customer", `{"customer_id":42,"stripe_customer_id":"cus_ABC","amount_cents":1,"billing_period":"2026-11"}`, Rules{}, ReasonBadFieldType, "customer_id"},
		{"duplicate amount", `{"customer_id":"c","stripe_customer_id":"cus_ABC","amount_cents":1,"amount_cents":100000,"billing_period":"2026-11"}`, Rules{}, ReasonDuplicateField, "amount_cents"},
		{"oversized", `{"customer_id":"c","stripe_customer_id":"cus_ABC","amount_cents":1,"billing_period":"2026-11","pad":"` + strings.Repeat("x", 5000) + `"}`, Rules{}, ReasonPayloadTooLarge, ""},
		{"unknown field strict", `{"customer_id":"c","stripe_customer_id":"cus_ABC","amount_cents":1,"billing_period":"2026-11","amount":1}`, Rules{StrictFields: true}, ReasonUnknownField, "amount"},
		{"invalid utf8", "{\"customer_id\":\"c\xff\",\"stripe_customer_id\":\"cus_ABC\",\"amount_cents\":1,\"billing_period\":\"2026-11\"}", Rules{}, ReasonNotJSON, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tc.payload), tc.rules)
			if err == nil {
				t.Fatalf("accepted %q", tc.payload)
			}
			var re *RejectError
			if !errors.As(err, &re) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not a RejectError", err)
			}
			if re.Reason != tc.reason || re.Field != tc.field {
				t.Fatalf("reason=%q field=%q, want %q %q (%v)", re.Reason, re.Field, tc.reason, tc.field, err)
			}
			if Reason(err) != tc.reason {
				t.Fatalf("Reason() = %q", Reason(err))
			}
		})
	}
}

func TestParseFields(t *testing.T) {
	t.Parallel()
	if _, err := ParseFields(map[string]any{"body": good}, Rules{}); Reason(err) != ReasonMissingPayload {
		t.Fatalf("missing payload field: %v", err)
	}
	if _, err := ParseFields(map[string]any{"payload": good}, Rules{}); err != nil {
		t.Fatal(err)
	}
}

// The key depends on business identity only (invariant 4): the same event
// read under another message id, consumer or stream has the same key, and
// the amount does not enter it either (a corrected amount is not a new charge).
func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	k := IdempotencyKey("c_42", "2026-11", "prod")
	if len(k) != 32 {
		t.Fatalf("key length %d", len(k))
	}
	// hex(sha256("c_42:2026-11:prod"))[:32], computed with sha256sum.
	if k != "cc255ce4cc8ecb0a3b4cb4603a8a05ab" {
		t.Fatalf("key %s does not match DESIGN.md's derivation", k)
	}
	if k != IdempotencyKey("c_42", "2026-11", "prod") {
		t.Fatal("key not deterministic")
	}
	if k == IdempotencyKey("c_42", "2026-11", "staging") {
		t.Fatal("namespaces must not share keys")
	}
	if k == IdempotencyKey("c_42", "2026-12", "prod") || k == IdempotencyKey("c_43", "2026-11", "prod") {
		t.Fatal("different customer or period must give a different key")
	}
	ev1, _ := Parse([]byte(good), Rules{})
	ev2, _ := Parse([]byte(`{"billing_period":"2026-11","amount_cents":2600,"customer_id":"c_42","stripe_customer_id":"cus_ABC","trace":"msg-1700000000000-0"}`), Rules{})
	if ev1.Key("prod") != ev2.Key("prod") || ev1.Key("prod") != k {
		t.Fatal("key must not depend on field order, amount, or envelope data")
	}
}

// occurred_at is optional, RFC 3339, kept in UTC, and survives Payload.
func TestOccurredAt(t *testing.T) {
	t.Parallel()
	ev, err := Parse([]byte(`{"customer_id":"c_1","stripe_customer_id":"cus_1","amount_cents":100,"billing_period":"2026-11","occurred_at":"2026-11-30T23:59:00+01:00"}`), Rules{StrictFields: true})
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Date(2026, 11, 30, 22, 59, 0, 0, time.UTC); !ev.OccurredAt.Equal(want) || ev.OccurredAt.Location() != time.UTC {
		t.Fatalf("OccurredAt %v, want %v", ev.OccurredAt, want)
	}
	back, err := Parse([]byte(ev.Payload()), Rules{StrictFields: true})
	if err != nil || back != ev {
		t.Fatalf("Payload round trip: %+v %v", back, err)
	}
	if _, err := Parse([]byte(`{"customer_id":"c_1","stripe_customer_id":"cus_1","amount_cents":100,"billing_period":"2026-11","occurred_at":"yesterday"}`), Rules{}); err == nil || !strings.Contains(err.Error(), ReasonBadOccurredAt) {
		t.Fatalf("a bad occurred_at: %v", err)
	}
}
