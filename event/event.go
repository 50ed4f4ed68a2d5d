// Package event parses and validates billing events read from the stream and
// derives their idempotency key.
//
// A stream entry carries the event as JSON in the field "payload":
//
//	{"customer_id":"c_42","stripe_customer_id":"cus_ABC","amount_cents":2500,
//	 "billing_period":"2026-11","currency":"usd"}
//
// Every rejection carries a machine-readable reason (the dead-letter stream's
// "reason" field) and a human-readable detail.
//
// Payload writes the canonical form of an event, and QuickKey reads an
// entry's key without validating it: the shortcuts the reaper takes to
// recognise already billed entries cheaply. The format lives here alone.
package event

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// PayloadField is the stream field that holds the event's JSON.
const PayloadField = "payload"

// Defaults for Rules.
const (
	DefaultMaxAmountCents  = 1_000_000 // $10,000.00: a usage charge above this is a bug until proven otherwise
	DefaultMaxPayloadBytes = 4096
	DefaultCurrency        = "usd"
)

// Rejection reasons. They are stable: dashboards and replay tooling key on them.
const (
	ReasonMissingPayload  = "missing_payload"
	ReasonPayloadTooLarge = "payload_too_large"
	ReasonNotJSON         = "not_json"
	ReasonNotObject       = "not_object"
	ReasonDuplicateField  = "duplicate_field"
	ReasonUnknownField    = "unknown_field"
	ReasonMissingField    = "missing_field"
	ReasonEmptyField      = "empty_field"
	ReasonBadFieldType    = "bad_field_type"
	ReasonBadIdentifier   = "bad_identifier"
	ReasonBadAmount       = "bad_amount"
	ReasonAmountTooSmall  = "amount_not_positive"
	ReasonAmountTooLarge  = "amount_too_large"
	ReasonBadCurrency     = "bad_currency"
	ReasonBadPeriod       = "bad_billing_period"
	ReasonBadStripeCust   = "bad_stripe_customer_id"
	ReasonBadOccurredAt   = "bad_occurred_at"
)

// Event is a validated billing event.
type Event struct {
	CustomerID       string `json:"customer_id"`
	StripeCustomerID string `json:"stripe_customer_id"`
	AmountCents      int64  `json:"amount_cents"`
	BillingPeriod    string `json:"billing_period"`
	Currency         string `json:"currency"`
	// OccurredAt is the optional `occurred_at` field (RFC 3339): when the
	// producer says the usage happened. A first charge of an event older
	// than the consumer's safe key window asks Stripe first (invariant 9):
	// it may be a re-publication of an event billed before a ledger was
	// restored from a backup. Zero when absent.
	OccurredAt time.Time `json:"occurred_at,omitzero"`
}

// Rules bound what a valid event may be.
type Rules struct {
	// MaxAmountCents rejects amounts above it. Zero means DefaultMaxAmountCents.
	MaxAmountCents int64
	// MaxPayloadBytes rejects larger payloads. Zero means DefaultMaxPayloadBytes.
	MaxPayloadBytes int
	// StrictFields rejects fields other than the known ones (the five, and occurred_at). By default
	// unknown fields are ignored, so producers can add tracing or source
	// fields without dead-lettering the stream; a misspelt required field is
	// still caught, as missing.
	StrictFields bool
}

func (r Rules) maxAmount() int64 {
	if r.MaxAmountCents > 0 {
		return r.MaxAmountCents
	}
	return DefaultMaxAmountCents
}

func (r Rules) maxPayload() int {
	if r.MaxPayloadBytes > 0 {
		return r.MaxPayloadBytes
	}
	return DefaultMaxPayloadBytes
}

// RejectError says why an event is invalid.
type RejectError struct {
	Reason string // one of the Reason constants
	Field  string // the field at fault, if any
	Detail string
}

func (e *RejectError) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("invalid event: %s (%s): %s", e.Reason, e.Field, e.Detail)
	}
	return fmt.Sprintf("invalid event: %s: %s", e.Reason, e.Detail)
}

// ErrInvalid matches every RejectError with errors.Is.
var ErrInvalid = errors.New("invalid event")

// Is makes errors.Is(err, ErrInvalid) true for rejections.
func (e *RejectError) Is(target error) bool { return target == ErrInvalid }

func reject(reason, field, format string, args ...any) error {
	return &RejectError{Reason: reason, Field: field, Detail: fmt.Sprintf(format, args...)}
}

// Reason returns the rejection reason of err, or "" when err is not a rejection.
func Reason(err error) string {
	var re *RejectError
	if errors.As(err, &re) {
		return re.Reason
	}
	return ""
}

var (
	// Identifiers: printable, no spaces, bounded; they end up in Stripe
	// metadata (500 chars max per value) and in the idempotency key.
	identRe    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,127}$`)
	currencyRe = regexp.MustCompile(`^[a-z]{3}$`)
	stripeCust = regexp.MustCompile(`^cus_[A-Za-z0-9]{1,64}$`)
)

var known = map[string]bool{
	"customer_id": true, "stripe_customer_id": true, "amount_cents": true,
	"billing_period": true, "currency": true, "occurred_at": true,
}

// ParseFields validates a stream entry's fields (as go-redis returns them).
func ParseFields(fields map[string]any, rules Rules) (Event, error) {
	raw, ok := fields[PayloadField]
	if !ok {
		return Event{}, reject(ReasonMissingPayload, PayloadField, "the entry has no %q field", PayloadField)
	}
	s, ok := raw.(string)
	if !ok {
		return Event{}, reject(ReasonBadFieldType, PayloadField, "payload is %T, want a string", raw)
	}
	return Parse([]byte(s), rules)
}

// Parse validates one JSON payload.
func Parse(payload []byte, rules Rules) (Event, error) {
	obj, err := decodePayload(payload, rules)
	if err != nil {
		return Event{}, err
	}
	if rules.StrictFields {
		for k := range obj {
			if !known[k] {
				return Event{}, reject(ReasonUnknownField, k, "field %q is not part of a billing event", k)
			}
		}
	}
	var ev Event
	if ev.CustomerID, err = stringField(obj, "customer_id", true); err != nil {
		return Event{}, err
	}
	if ev.StripeCustomerID, err = stringField(obj, "stripe_customer_id", true); err != nil {
		return Event{}, err
	}
	if ev.BillingPeriod, err = stringField(obj, "billing_period", true); err != nil {
		return Event{}, err
	}
	if ev.Currency, err = stringField(obj, "currency", false); err != nil {
		return Event{}, err
	}
	if ev.AmountCents, err = amountField(obj, rules.maxAmount()); err != nil {
		return Event{}, err
	}
	if !identRe.MatchString(ev.CustomerID) {
		return Event{}, reject(ReasonBadIdentifier, "customer_id", "must be 1-128 characters of letters, digits and ._:@/+=-")
	}
	if !stripeCust.MatchString(ev.StripeCustomerID) {
		return Event{}, reject(ReasonBadStripeCust, "stripe_customer_id", "must look like cus_XXXX")
	}
	if err := ValidPeriod(ev.BillingPeriod); err != nil {
		return Event{}, reject(ReasonBadPeriod, "billing_period", "%v", err)
	}
	if ev.Currency == "" {
		ev.Currency = DefaultCurrency
	}
	occurred, err := stringField(obj, "occurred_at", false)
	if err != nil {
		return Event{}, err
	}
	if occurred != "" {
		if ev.OccurredAt, err = time.Parse(time.RFC3339Nano, occurred); err != nil {
			return Event{}, reject(ReasonBadOccurredAt, "occurred_at", "%q is not an RFC 3339 time such as 2026-11-30T23:59:00Z", truncate(occurred))
		}
		ev.OccurredAt = ev.OccurredAt.UTC()
	}
	if !currencyRe.MatchString(ev.Currency) {
		return Event{}, reject(ReasonBadCurrency, "currency", "%q is not a lowercase ISO 4217 code such as usd", truncate(ev.Currency))
	}
	return ev, nil
}

// decodeObject reads a JSON object of scalar values, rejecting duplicate
// keys: {"amount_cents":1,"amount_cents":100000} must not be charged as
// whichever value a decoder happens to keep.
func decodeObject(payload []byte) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	tok, err := dec.Token()
	if err != nil {
		return nil, reject(ReasonNotJSON, "", "%v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, reject(ReasonNotObject, "", "payload must be a JSON object")
	}
	obj := make(map[string]json.RawMessage, 6)
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, reject(ReasonNotJSON, "", "%v", err)
		}
		k := kt.(string) // object keys are always strings
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, reject(ReasonNotJSON, k, "%v", err)
		}
		if _, dup := obj[k]; dup {
			return nil, reject(ReasonDuplicateField, k, "field %q appears twice", k)
		}
		obj[k] = v
	}
	if _, err := dec.Token(); err != nil { // closing brace
		return nil, reject(ReasonNotJSON, "", "%v", err)
	}
	if dec.More() {
		return nil, reject(ReasonNotJSON, "", "trailing data after the JSON object")
	}
	if _, err := dec.Token(); err == nil {
		return nil, reject(ReasonNotJSON, "", "trailing data after the JSON object")
	}
	return obj, nil
}

func stringField(obj map[string]json.RawMessage, name string, required bool) (string, error) {
	raw, ok := obj[name]
	if !ok || string(raw) == "null" {
		if required {
			return "", reject(ReasonMissingField, name, "required field is missing")
		}
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", reject(ReasonBadFieldType, name, "must be a string")
	}
	if strings.TrimSpace(s) == "" {
		if required {
			return "", reject(ReasonEmptyField, name, "required field is empty")
		}
		return "", reject(ReasonEmptyField, name, "field is present but empty")
	}
	return s, nil
}

// amountField accepts only a JSON integer: "2500" (a string), 25.00 (dollars
// by mistake?) and 2.5e3 are rejected rather than guessed at.
func amountField(obj map[string]json.RawMessage, max int64) (int64, error) {
	raw, ok := obj["amount_cents"]
	if !ok || string(raw) == "null" {
		return 0, reject(ReasonMissingField, "amount_cents", "required field is missing")
	}
	s := string(raw)
	if s == "" || s[0] == '"' || s[0] == '{' || s[0] == '[' || s == "true" || s == "false" {
		return 0, reject(ReasonBadFieldType, "amount_cents", "must be an integer number of cents")
	}
	if strings.ContainsAny(s, ".eE") {
		return 0, reject(ReasonBadAmount, "amount_cents", "%s is not an integer number of cents", truncate(s))
	}
	neg := strings.HasPrefix(s, "-")
	digits := strings.TrimPrefix(s, "-")
	if len(digits) > 18 {
		if neg {
			return 0, reject(ReasonAmountTooSmall, "amount_cents", "must be positive")
		}
		return 0, reject(ReasonAmountTooLarge, "amount_cents", "%s exceeds the maximum of %d", truncate(s), max)
	}
	var n int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, reject(ReasonBadAmount, "amount_cents", "%s is not an integer", truncate(s))
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	if n <= 0 {
		return 0, reject(ReasonAmountTooSmall, "amount_cents", "must be positive, got %d", n)
	}
	if n > max {
		return 0, reject(ReasonAmountTooLarge, "amount_cents", "%d exceeds the maximum of %d", n, max)
	}
	return n, nil
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// IdempotencyKey derives the Stripe idempotency key from business identity
// only (invariant 4): never the message id, delivery count, consumer or
// stream, all of which change across redeliveries, XAUTOCLAIM and AOF replay.
// namespace keeps environments (staging, production) from sharing keys.
func IdempotencyKey(customerID, billingPeriod, namespace string) string {
	sum := sha256.Sum256([]byte(customerID + ":" + billingPeriod + ":" + namespace))
	return hex.EncodeToString(sum[:])[:32]
}

// AttemptKey is the idempotency key of attempt n of a key's charge:
// attempt 1's is IdempotencyKey itself; attempt n >= 2's hashes the same
// business fields, the namespace and n (invariant 4). A later attempt
// exists only after Stripe's final failure of the one before was recorded.
func AttemptKey(customerID, billingPeriod, namespace string, n int) string {
	if n <= 1 {
		return IdempotencyKey(customerID, billingPeriod, namespace)
	}
	sum := sha256.Sum256([]byte(customerID + ":" + billingPeriod + ":" + namespace + ":" + strconv.Itoa(n)))
	return hex.EncodeToString(sum[:])[:32]
}

// Key is the event's idempotency key under namespace.
func (e Event) Key(namespace string) string {
	return IdempotencyKey(e.CustomerID, e.BillingPeriod, namespace)
}
