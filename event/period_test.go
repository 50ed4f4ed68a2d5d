package event

import (
	"strings"
	"testing"
)

// TestValidPeriod holds each form to real calendars: 2026-13 or 2025-W53
// would otherwise be billed as periods of their own, under keys no real
// period shares.
func TestValidPeriod(t *testing.T) {
	t.Parallel()
	good := []string{"2026-01", "2026-11", "2026-12", "2026-W01", "2026-W48", "2026-W53", "2020-W53",
		"2026-Q1", "2026-Q4", "2026-11-30", "2024-02-29", "1999-01"}
	bad := []string{"", "2026", "2026-13", "2026-00", "2026-1", "2026-011", "2025-W53", "2026-W00", "2026-W54",
		"2026-W4", "2026-Q0", "2026-Q5", "2026-q4", "2026-11-31", "2025-02-29", "2026-11-00", "2026-11-3",
		"2026-11-30-1", "26-11", "20x6-11", "2026/11", "November", "last month", "2026-11 ", " 2026-11", "2026-AB"}
	for _, p := range good {
		if err := ValidPeriod(p); err != nil {
			t.Errorf("ValidPeriod(%q) = %v, want nil", p, err)
		}
	}
	for _, p := range bad {
		err := ValidPeriod(p)
		if err == nil {
			t.Errorf("ValidPeriod(%q) = nil, want an error", p)
			continue
		}
		if !strings.Contains(err.Error(), "is not a billing period") {
			t.Errorf("ValidPeriod(%q) = %v: want the value named", p, err)
		}
	}
}

// TestParseRefusesImpossiblePeriods: an event's period goes through the
// same check, so 2026-13 is dead-lettered bad_billing_period instead of
// charged under a key of its own.
func TestParseRefusesImpossiblePeriods(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"2026-13", "2025-W53", "2026-Q5", "2026-11-31", "2026-00"} {
		payload := `{"customer_id":"c_1","stripe_customer_id":"cus_X","amount_cents":2500,"billing_period":"` + p + `"}`
		ev, err := Parse([]byte(payload), Rules{})
		if Reason(err) != ReasonBadPeriod {
			t.Errorf("period %s: parsed %+v, err %v; want %s (charged cents %d)", p, ev, err, ReasonBadPeriod, ev.AmountCents)
		}
	}
	for _, p := range []string{"2026-11", "2026-W48", "2026-Q4", "2026-11-30", "2026-W53"} {
		payload := `{"customer_id":"c_1","stripe_customer_id":"cus_X","amount_cents":2500,"billing_period":"` + p + `"}`
		if _, err := Parse([]byte(payload), Rules{}); err != nil {
			t.Errorf("period %s: %v", p, err)
		}
	}
}
