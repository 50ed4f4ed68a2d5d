package event

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"
)

// Payload returns the event as the JSON a producer would put on the stream:
// byte for byte what json.Marshal makes of it, fields in declaration order.
// The reaper compares stream payloads with the Payload of ledger rows' events
// to recognise already billed entries without parsing them (see QuickKey).
func (e Event) Payload() string {
	if !plain(e.CustomerID) || !plain(e.StripeCustomerID) || !plain(e.BillingPeriod) || !plain(e.Currency) {
		return e.marshal()
	}
	// Validated identifiers are never escaped by JSON, so the common case is
	// built by hand: json.Marshal was the reaper pass's largest cost.
	var b strings.Builder
	b.Grow(110 + len(e.CustomerID) + len(e.StripeCustomerID) + len(e.BillingPeriod))
	b.WriteString(`{"customer_id":"`)
	b.WriteString(e.CustomerID)
	b.WriteString(`","stripe_customer_id":"`)
	b.WriteString(e.StripeCustomerID)
	b.WriteString(`","amount_cents":`)
	b.WriteString(strconv.FormatInt(e.AmountCents, 10))
	b.WriteString(`,"billing_period":"`)
	b.WriteString(e.BillingPeriod)
	b.WriteString(`","currency":"`)
	b.WriteString(e.Currency)
	if !e.OccurredAt.IsZero() {
		b.WriteString(`","occurred_at":"`)
		b.WriteString(e.OccurredAt.Format(time.RFC3339Nano))
	}
	b.WriteString(`"}`)
	return b.String()
}

// marshal is Payload the slow way, for strings JSON might escape; tests hold
// the hand-built form to it.
func (e Event) marshal() string {
	b, _ := json.Marshal(e) // a struct of strings and an int cannot fail
	return string(b)
}

// plain reports a string json.Marshal copies verbatim.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// QuickKey reads customer_id and billing_period from a stream entry's fields
// (as go-redis returns them): enough to look a ledger row up before paying
// for a full Parse. It validates nothing and may misread an odd payload (a
// nested object holding a "billing_period", an escaped character), so a
// caller must never act on its reading alone: it may only use the row it
// finds to recognise a payload equal to that row's event's Payload, and must
// otherwise Parse and look again if the parsed key differs. The canonical
// layout (Payload's) is read without a JSON decoder.
func QuickKey(fields map[string]any) (customerID, billingPeriod string, ok bool) {
	s, ok := fields[PayloadField].(string)
	if !ok {
		return "", "", false
	}
	cust, ok1 := stringAfter(s, `{"customer_id":"`, true)
	period, ok2 := stringAfter(s, `,"billing_period":"`, false)
	if ok1 && ok2 {
		return cust, period, true
	}
	var k struct {
		CustomerID    string `json:"customer_id"`
		BillingPeriod string `json:"billing_period"`
	}
	if err := json.Unmarshal([]byte(s), &k); err != nil || k.CustomerID == "" || k.BillingPeriod == "" {
		return "", "", false
	}
	return k.CustomerID, k.BillingPeriod, true
}

// stringAfter returns the characters between marker (at the start of s when
// prefix, anywhere otherwise) and the next quote.
func stringAfter(s, marker string, prefix bool) (string, bool) {
	i := 0
	if prefix {
		if !strings.HasPrefix(s, marker) {
			return "", false
		}
	} else if i = strings.Index(s, marker); i < 0 {
		return "", false
	}
	rest := s[i+len(marker):]
	j := strings.IndexByte(rest, '"')
	if j <= 0 {
		return "", false
	}
	return rest[:j], true
}
