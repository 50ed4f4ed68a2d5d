package event

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// A usage event for a Stripe Billing Meter, read from the same stream field
// (PayloadField) as a charge event:
//
//	{"event_name":"api_requests","customer_id":"c_42","stripe_customer_id":"cus_ABC",
//	 "value":3,"timestamp":"2026-11-30T12:00:00Z","event_id":"req-9f2c"}
//
// event_name names the meter; customer_id (pelguard's own id) and event_id
// (the producer's id for the event) are optional. timestamp is RFC 3339 or
// whole unix seconds, and Stripe must still take it (see ParseMeter).
//
// Values are whole numbers in any JSON spelling that is exactly an integer
// (3, 3.0, 3e2); 3.5, "3" and true are refused rather than rounded or
// guessed at. Negative values are accepted: Stripe counts them (a
// correction that lowers a sum meter's total), and pelguard sends them as
// they are. At most MeterValueMaxDigits digits.

// Meter event rejection reasons (see also the charge event's: missing_field,
// bad_field_type, not_json, payload_too_large, …). Stable, like those.
const (
	ReasonBadEventName     = "bad_event_name"
	ReasonBadValue         = "bad_value"
	ReasonBadTimestamp     = "bad_timestamp"
	ReasonTimestampOutside = "timestamp_outside_window"
	ReasonBadEventID       = "bad_event_id"
)

// Meter event limits and defaults. Stripe's own bounds are copied from
// package stripeapi (a test holds them equal) so that a producer importing
// this package does not import stripe-go.
const (
	// MeterEventMaxAge and MeterEventMaxFuture: Stripe takes timestamps at
	// most 35 days old and 5 minutes ahead (stripeapi.CheckMeterTimestamp).
	MeterEventMaxAge    = 35 * 24 * time.Hour
	MeterEventMaxFuture = 5 * time.Minute
	// MeterEventNameMaxLen: Stripe's longest event name (bytes here).
	MeterEventNameMaxLen = 100
	// MeterValueMaxDigits: Stripe refuses values of more digits.
	MeterValueMaxDigits = 15
	// MaxMeterEventIDBytes bounds event_id (hashed into the identifier,
	// never sent to Stripe as such).
	MaxMeterEventIDBytes = 256
	// DefaultMeterSendingSlack is MeterRules.SendingSlack's default.
	DefaultMeterSendingSlack = 10 * time.Minute
)

// MeterEvent is a validated usage event.
type MeterEvent struct {
	// EventName is the meter's event_name.
	EventName string `json:"event_name"`
	// CustomerID is pelguard's customer id, optional (operators, reports).
	CustomerID       string `json:"customer_id,omitempty"`
	StripeCustomerID string `json:"stripe_customer_id"`
	Value            int64  `json:"value"`
	// Timestamp is when the usage happened, in UTC, to the millisecond
	// (finer digits are dropped: the identifier is built from milliseconds,
	// and two spellings of one instant must stay one event).
	Timestamp time.Time `json:"timestamp"`
	// EventID is the producer's id for the event, optional.
	EventID string `json:"event_id,omitempty"`
}

// MeterRules bound what a valid meter event may be.
type MeterRules struct {
	// MaxPayloadBytes rejects larger payloads. Zero means DefaultMaxPayloadBytes.
	MaxPayloadBytes int
	// StrictFields rejects fields other than the six known ones.
	StrictFields bool
	// SendingSlack narrows the oldest timestamp accepted: an event this close
	// to Stripe's 35 days is refused, since it would likely be too old by the
	// time it is sent (and the clocks of this host and Stripe's differ).
	// Zero means DefaultMeterSendingSlack; negative means none.
	SendingSlack time.Duration
}

func (r MeterRules) slack() time.Duration {
	switch {
	case r.SendingSlack < 0:
		return 0
	case r.SendingSlack == 0:
		return DefaultMeterSendingSlack
	}
	return r.SendingSlack
}

var knownMeter = map[string]bool{
	"event_name": true, "customer_id": true, "stripe_customer_id": true,
	"value": true, "timestamp": true, "event_id": true,
}

// ParseMeterFields validates a stream entry's fields (as go-redis returns
// them) as a meter event; now is the validating host's clock.
func ParseMeterFields(fields map[string]any, rules MeterRules, now time.Time) (MeterEvent, error) {
	raw, ok := fields[PayloadField]
	if !ok {
		return MeterEvent{}, reject(ReasonMissingPayload, PayloadField, "the entry has no %q field", PayloadField)
	}
	s, ok := raw.(string)
	if !ok {
		return MeterEvent{}, reject(ReasonBadFieldType, PayloadField, "payload is %T, want a string", raw)
	}
	return ParseMeter([]byte(s), rules, now)
}

// ParseMeter validates one JSON meter event. now is the validating host's
// clock: the timestamp must be one Stripe takes (MeterTimestampOK: at most 35
// days old, at most 5 minutes ahead), less MeterRules.SendingSlack on the
// old side.
func ParseMeter(payload []byte, rules MeterRules, now time.Time) (MeterEvent, error) {
	obj, err := decodePayload(payload, Rules{MaxPayloadBytes: rules.MaxPayloadBytes})
	if err != nil {
		return MeterEvent{}, err
	}
	if rules.StrictFields {
		for k := range obj {
			if !knownMeter[k] {
				return MeterEvent{}, reject(ReasonUnknownField, k, "field %q is not part of a meter event", k)
			}
		}
	}
	var ev MeterEvent
	if ev.EventName, err = stringField(obj, "event_name", true); err != nil {
		return MeterEvent{}, err
	}
	if ev.StripeCustomerID, err = stringField(obj, "stripe_customer_id", true); err != nil {
		return MeterEvent{}, err
	}
	if ev.CustomerID, err = stringField(obj, "customer_id", false); err != nil {
		return MeterEvent{}, err
	}
	if ev.EventID, err = stringField(obj, "event_id", false); err != nil {
		return MeterEvent{}, err
	}
	switch {
	case len(ev.EventName) > MeterEventNameMaxLen || !printable(ev.EventName):
		return MeterEvent{}, reject(ReasonBadEventName, "event_name",
			"must be 1-%d bytes of printable characters without spaces (the meter's event_name)", MeterEventNameMaxLen)
	case !stripeCust.MatchString(ev.StripeCustomerID):
		return MeterEvent{}, reject(ReasonBadStripeCust, "stripe_customer_id", "must look like cus_XXXX")
	case ev.CustomerID != "" && !identRe.MatchString(ev.CustomerID):
		return MeterEvent{}, reject(ReasonBadIdentifier, "customer_id", "must be 1-128 characters of letters, digits and ._:@/+=-")
	case len(ev.EventID) > MaxMeterEventIDBytes || (ev.EventID != "" && !printable(ev.EventID)):
		return MeterEvent{}, reject(ReasonBadEventID, "event_id", "must be 1-%d bytes of printable characters without spaces", MaxMeterEventIDBytes)
	}
	raw, ok := obj["value"]
	if !ok || string(raw) == "null" {
		return MeterEvent{}, reject(ReasonMissingField, "value", "required field is missing")
	}
	if ev.Value, err = wholeNumber(raw, "value", MeterValueMaxDigits); err != nil {
		return MeterEvent{}, err
	}
	if ev.Timestamp, err = meterTimestamp(obj, rules.slack(), now); err != nil {
		return MeterEvent{}, err
	}
	return ev, nil
}

// decodePayload is Parse's common front: size, emptiness, UTF-8, one JSON
// object of unique keys.
func decodePayload(payload []byte, rules Rules) (map[string]json.RawMessage, error) {
	if len(payload) > rules.maxPayload() {
		return nil, reject(ReasonPayloadTooLarge, "", "%d bytes, limit %d", len(payload), rules.maxPayload())
	}
	if len(bytes.TrimSpace(payload)) == 0 {
		return nil, reject(ReasonMissingPayload, PayloadField, "payload is empty")
	}
	if !utf8.Valid(payload) {
		return nil, reject(ReasonNotJSON, "", "payload is not valid UTF-8")
	}
	return decodeObject(payload)
}

// printable: no control or space characters (an event name or id with a
// trailing space or a newline is a producer's bug, not a distinct meter).
func printable(s string) bool {
	for _, r := range s {
		if unicode.IsControl(r) || unicode.IsSpace(r) || r == utf8.RuneError {
			return false
		}
	}
	return s != ""
}

// meterTimestamp reads "timestamp": an RFC 3339 string or whole unix
// seconds, which Stripe must still take at now (less slack on the old side).
func meterTimestamp(obj map[string]json.RawMessage, slack time.Duration, now time.Time) (time.Time, error) {
	raw, ok := obj["timestamp"]
	if !ok || string(raw) == "null" {
		return time.Time{}, reject(ReasonMissingField, "timestamp", "required field is missing (RFC 3339 or unix seconds)")
	}
	var ts time.Time
	if s := string(raw); s != "" && s[0] == '"' {
		var str string
		if err := json.Unmarshal(raw, &str); err != nil {
			return time.Time{}, reject(ReasonBadTimestamp, "timestamp", "not a string")
		}
		if str != "" && strings.Trim(str, "0123456789") == "" {
			// "1764504000": unix seconds in a string, as many producers
			// write numbers; the same event as the number.
			secs, err := wholeNumber(json.RawMessage(str), "timestamp", 12)
			if err != nil {
				return time.Time{}, reject(ReasonBadTimestamp, "timestamp", "%q is neither an RFC 3339 string nor whole unix seconds (not milliseconds)", truncate(str))
			}
			ts = time.Unix(secs, 0)
		} else {
			t, err := time.Parse(time.RFC3339Nano, str)
			if err != nil {
				return time.Time{}, reject(ReasonBadTimestamp, "timestamp", "%q is not an RFC 3339 time such as 2026-11-30T12:00:00Z, nor unix seconds", truncate(str))
			}
			ts = t
		}
	} else {
		secs, err := wholeNumber(raw, "timestamp", 12)
		if err != nil {
			return time.Time{}, reject(ReasonBadTimestamp, "timestamp", "%s is neither an RFC 3339 string nor whole unix seconds (not milliseconds)", truncate(s))
		}
		ts = time.Unix(secs, 0)
	}
	ts = ts.UTC().Truncate(time.Millisecond)
	inside := MeterTimestampOK(ts, now)
	if inside && ts.Before(now.Add(-MeterEventMaxAge+slack)) {
		return time.Time{}, reject(ReasonTimestampOutside, "timestamp", "%s is within %s of Stripe's 35-day limit at %s: too old to be sent in time",
			ts.Format(time.RFC3339), slack, now.UTC().Format(time.RFC3339))
	}
	if !inside {
		return time.Time{}, reject(ReasonTimestampOutside, "timestamp", "%s: Stripe takes events at most 35 days old and 5 minutes ahead (checked at %s)",
			ts.Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	return ts, nil
}

// MeterTimestampOK reports whether Stripe takes an event of time ts when its
// clock reads now: stripeapi.CheckMeterTimestamp's rule, without an error.
func MeterTimestampOK(ts, now time.Time) bool {
	return !ts.Before(now.Add(-MeterEventMaxAge)) && !ts.After(now.Add(MeterEventMaxFuture))
}

// wholeNumber reads a JSON number that is exactly an integer of at most
// maxDigits digits: 3, -3, 3.0, 3e2 and 1.5e1 are; 3.5, 1e-3, "3" and true
// are not. Exponents are bounded before anything is multiplied.
func wholeNumber(raw json.RawMessage, field string, maxDigits int) (int64, error) {
	s := string(raw)
	if s == "" || !(s[0] == '-' || s[0] >= '0' && s[0] <= '9') {
		return 0, reject(ReasonBadFieldType, field, "must be a JSON number, not %s", truncate(s))
	}
	neg := s[0] == '-'
	mant, exp := strings.TrimPrefix(s, "-"), 0
	if i := strings.IndexAny(mant, "eE"); i >= 0 {
		e, err := strconv.Atoi(strings.TrimPrefix(mant[i+1:], "+"))
		if err != nil || e > 40 || e < -40 {
			return 0, reject(ReasonBadValue, field, "%s is not a whole number of at most %d digits", truncate(s), maxDigits)
		}
		mant, exp = mant[:i], e
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	num := strings.TrimLeft(intPart+frac, "0")
	scale := exp - len(frac)
	for scale < 0 && strings.HasSuffix(num, "0") {
		num, scale = num[:len(num)-1], scale+1
	}
	switch {
	case num == "":
		return 0, nil
	case scale < 0:
		return 0, reject(ReasonBadValue, field, "%s is not a whole number", truncate(s))
	case len(num)+scale > maxDigits:
		return 0, reject(ReasonBadValue, field, "%s has more than %d digits", truncate(s), maxDigits)
	}
	n, err := strconv.ParseInt(num+strings.Repeat("0", scale), 10, 64)
	if err != nil { // the grammar above let something odd through
		return 0, reject(ReasonBadValue, field, "%s is not a whole number", truncate(s))
	}
	if neg {
		n = -n
	}
	return n, nil
}

// Identifier is the event's Stripe meter-event identifier under namespace
// (which keeps environments apart, as for idempotency keys): "pg_" and 48
// hex digits of a SHA-256 over the namespace, event name, Stripe customer,
// event id (or, without one, the value) and the timestamp in milliseconds,
// each length-prefixed so no two field lists hash alike. It depends on
// business fields only, never on a message id, delivery or consumer, so an
// XAUTOCLAIM, a re-read batch, an AOF rollback or a re-publication of the
// event yields the same identifier and Stripe (within its window) or the
// ledger (at any age) counts it once.
//
// The rule for look-alikes: without event_id, two genuine events with the
// same meter, customer, value and millisecond are one event, counted once.
// A producer that can emit such twins must send an event_id. With an
// event_id, the value is not part of the identifier: an event re-published
// with another value is the same event, and the ledger refuses it as a
// conflict instead of counting it again.
func (e MeterEvent) Identifier(namespace string) string {
	which := "value=" + strconv.FormatInt(e.Value, 10)
	if e.EventID != "" {
		which = "id=" + e.EventID
	}
	h := sha256.New()
	for _, f := range []string{"pelguard-meter-v1", namespace, e.EventName, e.StripeCustomerID, which,
		strconv.FormatInt(e.Timestamp.UnixMilli(), 10)} {
		h.Write([]byte(strconv.Itoa(len(f)) + ":" + f))
	}
	return "pg_" + hex.EncodeToString(h.Sum(nil))[:48]
}

// Payload returns the event as the JSON a producer would put on the stream
// (timestamp in RFC 3339): ParseMeter reads it back as the same event.
func (e MeterEvent) Payload() string {
	e.Timestamp = e.Timestamp.UTC()
	b, _ := json.Marshal(e) // strings, an integer and a time: cannot fail
	return string(b)
}
