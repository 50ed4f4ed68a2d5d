package event

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/stripeapi"
)

var meterNow = time.Date(2026, 11, 30, 13, 0, 0, 0, time.UTC)

const goodMeter = `{"event_name":"api_requests","customer_id":"c_42","stripe_customer_id":"cus_ABC","value":3,"timestamp":"2026-11-30T12:00:00Z","event_id":"req-9f2c"}`

func TestParseMeterGood(t *testing.T) {
	t.Parallel()
	ev, err := ParseMeter([]byte(goodMeter), MeterRules{StrictFields: true}, meterNow)
	if err != nil {
		t.Fatal(err)
	}
	want := MeterEvent{EventName: "api_requests", CustomerID: "c_42", StripeCustomerID: "cus_ABC", Value: 3,
		Timestamp: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), EventID: "req-9f2c"}
	if ev != want {
		t.Fatalf("got %+v, want %+v", ev, want)
	}
	back, err := ParseMeter([]byte(ev.Payload()), MeterRules{StrictFields: true}, meterNow)
	if err != nil || back != ev {
		t.Fatalf("Payload %s round trip: %+v %v", ev.Payload(), back, err)
	}
	// Unix seconds; customer_id and event_id optional; unknown fields ignored by default.
	ev, err = ParseMeter([]byte(`{"event_name":"tokens","stripe_customer_id":"cus_X","value":-7,"timestamp":1796040000,"trace":"x"}`), MeterRules{}, meterNow)
	if err != nil || ev.Value != -7 || !ev.Timestamp.Equal(time.Unix(1796040000, 0)) || ev.Timestamp.Location() != time.UTC || ev.CustomerID != "" {
		t.Fatalf("unix seconds, negative value: %+v %v", ev, err)
	}
	// Whole numbers in any spelling.
	for raw, want := range map[string]int64{"0": 0, "-0": 0, "3.0": 3, "3e2": 300, "1.5e1": 15, "2500E-2": 25,
		"999999999999999": 999999999999999, "-999999999999999": -999999999999999, "0.000e5": 0} {
		ev, err := ParseMeter([]byte(`{"event_name":"n","stripe_customer_id":"cus_X","value":`+raw+`,"timestamp":"2026-11-30T12:00:00Z"}`), MeterRules{}, meterNow)
		if err != nil || ev.Value != want {
			t.Errorf("value %s: got %d %v, want %d", raw, ev.Value, err, want)
		}
	}
	if _, err := ParseMeterFields(map[string]any{PayloadField: goodMeter}, MeterRules{}, meterNow); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseMeterFields(map[string]any{"body": goodMeter}, MeterRules{}, meterNow); Reason(err) != ReasonMissingPayload {
		t.Fatalf("missing payload: %v", err)
	}
}

func TestParseMeterRejects(t *testing.T) {
	t.Parallel()
	with := func(field, raw string) string {
		fields := map[string]string{"event_name": `"api_requests"`, "stripe_customer_id": `"cus_ABC"`, "value": `3`, "timestamp": `"2026-11-30T12:00:00Z"`}
		if raw == "" {
			delete(fields, field)
		} else {
			fields[field] = raw
		}
		var parts []string
		for _, k := range []string{"event_name", "stripe_customer_id", "value", "timestamp", "customer_id", "event_id", "extra"} {
			if v, ok := fields[k]; ok {
				parts = append(parts, `"`+k+`":`+v)
			}
		}
		return "{" + strings.Join(parts, ",") + "}"
	}
	cases := []struct {
		name, payload, reason, field string
		rules                        MeterRules
	}{
		{"fractional value", with("value", "3.5"), ReasonBadValue, "value", MeterRules{}},
		{"tiny exponent", with("value", "1e-3"), ReasonBadValue, "value", MeterRules{}},
		{"string value", with("value", `"3"`), ReasonBadFieldType, "value", MeterRules{}},
		{"bool value", with("value", "true"), ReasonBadFieldType, "value", MeterRules{}},
		{"16 digits", with("value", "1234567890123456"), ReasonBadValue, "value", MeterRules{}},
		{"huge exponent", with("value", "1e400"), ReasonBadValue, "value", MeterRules{}},
		{"exponent past 15 digits", with("value", "1e15"), ReasonBadValue, "value", MeterRules{}},
		{"no value", with("value", ""), ReasonMissingField, "value", MeterRules{}},
		{"null value", with("value", "null"), ReasonMissingField, "value", MeterRules{}},
		{"no timestamp", with("timestamp", ""), ReasonMissingField, "timestamp", MeterRules{}},
		{"bad timestamp", with("timestamp", `"yesterday"`), ReasonBadTimestamp, "timestamp", MeterRules{}},
		{"milliseconds", with("timestamp", "1796040000000"), ReasonBadTimestamp, "timestamp", MeterRules{}},
		{"fractional seconds", with("timestamp", "1796040000.5"), ReasonBadTimestamp, "timestamp", MeterRules{}},
		{"36 days old", with("timestamp", `"2026-10-25T12:00:00Z"`), ReasonTimestampOutside, "timestamp", MeterRules{}},
		{"inside the slack", with("timestamp", `"2026-10-26T13:05:00Z"`), ReasonTimestampOutside, "timestamp", MeterRules{}},
		{"6 minutes ahead", with("timestamp", `"2026-11-30T13:06:00Z"`), ReasonTimestampOutside, "timestamp", MeterRules{}},
		{"no event name", with("event_name", ""), ReasonMissingField, "event_name", MeterRules{}},
		{"empty event name", with("event_name", `" "`), ReasonEmptyField, "event_name", MeterRules{}},
		{"long event name", with("event_name", `"`+strings.Repeat("e", 101)+`"`), ReasonBadEventName, "event_name", MeterRules{}},
		{"event name with a space", with("event_name", `"api requests"`), ReasonBadEventName, "event_name", MeterRules{}},
		{"numeric event name", with("event_name", `7`), ReasonBadFieldType, "event_name", MeterRules{}},
		{"no stripe customer", with("stripe_customer_id", ""), ReasonMissingField, "stripe_customer_id", MeterRules{}},
		{"bad stripe customer", with("stripe_customer_id", `"acct_1"`), ReasonBadStripeCust, "stripe_customer_id", MeterRules{}},
		{"bad customer id", with("customer_id", `"c 42"`), ReasonBadIdentifier, "customer_id", MeterRules{}},
		{"event id with newline", with("event_id", `"a\nb"`), ReasonBadEventID, "event_id", MeterRules{}},
		{"long event id", with("event_id", `"`+strings.Repeat("i", 257)+`"`), ReasonBadEventID, "event_id", MeterRules{}},
		{"unknown field strict", with("extra", `1`), ReasonUnknownField, "extra", MeterRules{StrictFields: true}},
		{"duplicate value", `{"event_name":"n","stripe_customer_id":"cus_A","value":1,"value":100,"timestamp":1796040000}`, ReasonDuplicateField, "value", MeterRules{}},
		{"not json", `api_requests 3`, ReasonNotJSON, "", MeterRules{}},
		{"oversized", with("extra", `"`+strings.Repeat("x", 5000)+`"`), ReasonPayloadTooLarge, "", MeterRules{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParseMeter([]byte(tc.payload), tc.rules, meterNow)
			var re *RejectError
			if !errors.As(err, &re) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("%s: accepted or not a RejectError: %v", tc.payload, err)
			}
			if re.Reason != tc.reason || re.Field != tc.field {
				t.Fatalf("reason=%q field=%q, want %q %q (%v)", re.Reason, re.Field, tc.reason, tc.field, err)
			}
		})
	}
	// A negative slack turns the margin off: 35 days less a minute is taken.
	if _, err := ParseMeter([]byte(with("timestamp", `"2026-10-26T13:01:00Z"`)), MeterRules{SendingSlack: -1}, meterNow); err != nil {
		t.Fatalf("no slack: %v", err)
	}
}

// The identifier depends on business fields only, spelled in any way; it
// is the documented derivation (a golden value computed outside Go); and it separates what must be separate.
func TestMeterIdentifier(t *testing.T) {
	t.Parallel()
	ev, err := ParseMeter([]byte(goodMeter), MeterRules{}, meterNow)
	if err != nil {
		t.Fatal(err)
	}
	id := ev.Identifier("prod")
	// Computed with Python's hashlib over "17:pelguard-meter-v1" "4:prod"
	// "12:api_requests" "7:cus_ABC" "11:id=req-9f2c" "13:1796040000000".
	if want := "pg_fd63abf3e80b3adae6e61b63eaff5a8b59fe8f098248cd39"; id != want || len(id) > stripeapi.MeterIdentifierMaxLen {
		t.Fatalf("identifier %s, want %s", id, want)
	}
	// Another spelling of the same event: field order, unix seconds,
	// sub-millisecond digits, another offset, no customer_id, extra fields.
	same := `{"trace":"msg-1-0","timestamp":"2026-11-30T13:00:00.0004+01:00","value":3.0,"stripe_customer_id":"cus_ABC","event_id":"req-9f2c","event_name":"api_requests"}`
	ev2, err := ParseMeter([]byte(same), MeterRules{}, meterNow)
	if err != nil || ev2.Identifier("prod") != id {
		t.Fatalf("same event, other spelling: %v %s", err, ev2.Identifier("prod"))
	}
	// With an event id the value is not part of it (a re-publication with
	// another value is the same event: the ledger calls it a conflict).
	v := ev
	v.Value = 4
	if v.Identifier("prod") != id {
		t.Fatal("with an event id, the value must not change the identifier")
	}
	noID := ev
	noID.EventID = ""
	for name, other := range map[string]MeterEvent{
		"value (no event id)": func() MeterEvent { e := noID; e.Value = 4; return e }(),
		"millisecond":         func() MeterEvent { e := noID; e.Timestamp = e.Timestamp.Add(time.Millisecond); return e }(),
		"meter":               func() MeterEvent { e := noID; e.EventName = "tokens"; return e }(),
		"stripe customer":     func() MeterEvent { e := noID; e.StripeCustomerID = "cus_ABD"; return e }(),
		"event id":            ev,
	} {
		if other.Identifier("prod") == noID.Identifier("prod") {
			t.Errorf("%s: identifiers collide", name)
		}
	}
	if noID.Identifier("prod") == noID.Identifier("staging") {
		t.Error("namespaces must not share identifiers")
	}
	// Length prefixes: moving a character between fields is another event.
	a := MeterEvent{EventName: "ab", StripeCustomerID: "cus_c", Value: 1, Timestamp: ev.Timestamp}
	b := MeterEvent{EventName: "a", StripeCustomerID: "bcus_c", Value: 1, Timestamp: ev.Timestamp}
	if a.Identifier("") == b.Identifier("") {
		t.Error("ambiguous field separation")
	}
	// The value spelled "id=" cannot pass for an event id.
	c := noID
	c.EventID = "value=3"
	if c.Identifier("prod") == noID.Identifier("prod") {
		t.Error("an event id equal to the value tag collides")
	}
}

// event copies Stripe's bounds so that producers need not import
// stripe-go: they must stay stripeapi's.
func TestMeterBoundsAreStripeapis(t *testing.T) {
	t.Parallel()
	if MeterEventMaxAge != stripeapi.MeterEventMaxAge || MeterEventMaxFuture != stripeapi.MeterEventMaxFuture ||
		MeterEventNameMaxLen != stripeapi.MeterIdentifierMaxLen || MeterValueMaxDigits != stripeapi.MeterValueMaxDigits {
		t.Fatal("event's meter bounds differ from stripeapi's")
	}
	for _, d := range []time.Duration{-MeterEventMaxAge - time.Second, -MeterEventMaxAge, -MeterEventMaxAge + time.Second, 0,
		MeterEventMaxFuture - time.Second, MeterEventMaxFuture, MeterEventMaxFuture + time.Nanosecond} {
		ts := meterNow.Add(d)
		if got, want := MeterTimestampOK(ts, meterNow), stripeapi.CheckMeterTimestamp(ts, meterNow) == nil; got != want {
			t.Errorf("now%+v: MeterTimestampOK %v, stripeapi %v", d, got, want)
		}
	}
}

// FuzzParseMeter: never panics; what it accepts obeys its rules and reads
// back from Payload as the same event. Run: go test -fuzz FuzzParseMeter ./event/
func FuzzParseMeter(f *testing.F) {
	f.Add([]byte(goodMeter))
	f.Add([]byte(`{"event_name":"n","stripe_customer_id":"cus_A","value":1e15,"timestamp":1796040000}`))
	f.Add([]byte(`{"event_name":"n","stripe_customer_id":"cus_A","value":-0.0e-0,"timestamp":"2026-11-30T12:00:00.999999Z"}`))
	f.Add([]byte(`{"event_name":"n","stripe_customer_id":"cus_A","value":00,"timestamp":1796040000}`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		ev, err := ParseMeter(payload, MeterRules{}, meterNow)
		if err != nil {
			if !errors.Is(err, ErrInvalid) || Reason(err) == "" {
				t.Fatalf("error without a reason: %v", err)
			}
			return
		}
		if ev.EventName == "" || len(ev.EventName) > MeterEventNameMaxLen || !MeterTimestampOK(ev.Timestamp, meterNow) ||
			ev.Value >= 1e15 || ev.Value <= -1e15 || !ev.Timestamp.Equal(ev.Timestamp.Truncate(time.Millisecond)) {
			t.Fatalf("accepted an invalid event: %+v", ev)
		}
		back, err := ParseMeter([]byte(ev.Payload()), MeterRules{}, meterNow)
		if err != nil || back != ev || back.Identifier("x") != ev.Identifier("x") {
			t.Fatalf("Payload %s read back as %+v, %v; want %+v", ev.Payload(), back, err, ev)
		}
	})
}

// TestMeterTimestampUnixSecondsInAString: the docs say unix seconds are
// accepted; "1796040000" (a string, as many producers write numbers) is the
// same time, and the same event (identifier), as the number; milliseconds
// in a string are refused as they are as a number.
func TestMeterTimestampUnixSecondsInAString(t *testing.T) {
	t.Parallel()
	const body = `{"event_name":"tokens","stripe_customer_id":"cus_X","value":2,"timestamp":%s}`
	num, err := ParseMeter([]byte(fmt.Sprintf(body, `1796040000`)), MeterRules{}, meterNow)
	if err != nil {
		t.Fatal(err)
	}
	str, err := ParseMeter([]byte(fmt.Sprintf(body, `"1796040000"`)), MeterRules{}, meterNow)
	if err != nil || !str.Timestamp.Equal(time.Unix(1796040000, 0)) {
		t.Fatalf("string of unix seconds: %+v %v", str, err)
	}
	if str.Identifier("ns") != num.Identifier("ns") {
		t.Errorf("identifier %s for the string, %s for the number: one event", str.Identifier("ns"), num.Identifier("ns"))
	}
	if _, err := ParseMeter([]byte(fmt.Sprintf(body, `"1796040000000"`)), MeterRules{}, meterNow); Reason(err) != ReasonBadTimestamp {
		t.Errorf("milliseconds in a string: %v, want %s", err, ReasonBadTimestamp)
	}
}
