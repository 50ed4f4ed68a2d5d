package stripeapi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/stripe/stripe-go/v76"
)

// Billing meters: usage sent to Stripe as meter events, counted by a meter.
// What this file relies on, and where it comes from ("documented": Stripe's
// docs or the API reference stripe-go v76.25.0 is generated from;
// "reported": users' reports, not Stripe's docs; "assumed": ours):
//
//   - POST /v1/billing/meter_events with event_name, payload[<customer key>],
//     payload[<value key>] (defaults stripe_customer_id and value), an
//     optional identifier of at most 100 characters and an optional
//     timestamp within the past 35 calendar days and at most 5 minutes
//     ahead (documented).
//   - a repeated identifier is refused within a rolling window of at least
//     24 hours (documented) with a 400 invalid_request_error whose message
//     is "An event already exists with identifier <id>." (reported; matched
//     loosely, see meterEventError): ErrDuplicateIdentifier.
//   - live mode: 1,000 meter-event calls/s per account, a limit of their
//     own outside the basic 100/s; test mode: they count against the basic
//     limit (documented, docs.stripe.com/rate-limits): Config.MeterLimiter.
//   - one concurrent call per customer per meter (documented, under
//     Stripe's concurrency limiter). The answer to a second call is not
//     documented; a 429 as Stripe's limiters answer is assumed, and any 429
//     is ErrTransient: the event was not recorded, send it again later.
//   - values: documented as numerical; more than 15 significant digits is
//     refused (documented, changelog 2026-04-22). pelguard sends integers.
//   - cancelling by identifier (meter event adjustment, type cancel,
//     event_name required) only within 24 hours of Stripe receiving the
//     event (documented).
//   - no API lists or retrieves individual meter events (documented by
//     absence); summaries per customer are the only read.
//   - some validation happens after the 200 and is reported in
//     v1.billing.meter.error_report_triggered events (documented); those are
//     v2 "thin" events stripe-go v76 cannot parse: not handled here.

// Stripe's documented meter-event limits.
const (
	// MeterIdentifierMaxLen is the longest identifier (and event name)
	// Stripe accepts. SendMeterEvent counts bytes: stricter than
	// characters for anything but ASCII.
	MeterIdentifierMaxLen = 100
	// MeterIdentifierWindow is the least time Stripe refuses a repeated
	// identifier for ("a rolling period of at least 24 hours").
	MeterIdentifierWindow = 24 * time.Hour
	// MeterCancelWindow is how long after Stripe received an event it can
	// be cancelled.
	MeterCancelWindow = 24 * time.Hour
	// MeterEventMaxAge and MeterEventMaxFuture bound an event's timestamp
	// around Stripe's now.
	MeterEventMaxAge    = 35 * 24 * time.Hour
	MeterEventMaxFuture = 5 * time.Minute
	// MeterValueMaxDigits is the most significant digits of a value.
	MeterValueMaxDigits = 15
)

// Meter formulas (default_aggregation[formula]).
const (
	MeterFormulaSum   = "sum"
	MeterFormulaCount = "count"
	MeterFormulaLast  = "last"
)

// MeterEvent is one usage event to send.
type MeterEvent struct {
	// EventName names the meter (its event_name).
	EventName        string
	StripeCustomerID string
	// Value is the usage; negative values are sent as they are (whether
	// Stripe accepts them is not documented).
	Value int64
	// Identifier is Stripe's deduplication key: a repeat within Stripe's
	// window is refused (ErrDuplicateIdentifier). It also makes the
	// call's Idempotency-Key ("pelguard-meter:" + Identifier), so a retry
	// after an unknown outcome is answered from Stripe's idempotency record
	// (within its 24 h) rather than refused. Empty: Stripe generates one
	// and nothing protects a second send: the naive baseline only.
	Identifier string
	// IdempotencyKey, when set, replaces the Idempotency-Key derived from
	// Identifier: the auditor's re-send of an event Stripe dropped after
	// its 200 (whose first answer Stripe's idempotency record would replay)
	// still meets the identifier's own deduplication. Up to 255 characters.
	IdempotencyKey string
	// Timestamp is when the usage happened; zero means Stripe's now.
	// CheckMeterTimestamp says whether Stripe will take it.
	Timestamp time.Time
}

// MeterEventResult is Stripe's answer to a meter event it accepted. An
// accepted event may still be rejected after the 200 (see the file's doc).
type MeterEventResult struct {
	// Identifier is the event's identifier: the one sent, or Stripe's.
	Identifier string
	Timestamp  time.Time
	Created    time.Time
	// Replayed reports an answer from Stripe's idempotency record: an
	// earlier attempt of this call reached Stripe.
	Replayed bool
}

func (e MeterEvent) validate() error {
	switch {
	case e.EventName == "" || e.StripeCustomerID == "":
		return fmt.Errorf("%w: EventName and StripeCustomerID are required", ErrInvalidRequest)
	case len(e.EventName) > MeterIdentifierMaxLen:
		return fmt.Errorf("%w: event name longer than %d characters", ErrInvalidRequest, MeterIdentifierMaxLen)
	case len(e.Identifier) > MeterIdentifierMaxLen:
		return fmt.Errorf("%w: identifier longer than %d characters", ErrInvalidRequest, MeterIdentifierMaxLen)
	case len(e.IdempotencyKey) > 255 || (e.IdempotencyKey != "" && e.Identifier == ""):
		return fmt.Errorf("%w: an IdempotencyKey needs an Identifier and at most 255 characters", ErrInvalidRequest)
	case digits(e.Value) > MeterValueMaxDigits:
		return fmt.Errorf("%w: value %d has more than %d digits", ErrInvalidRequest, e.Value, MeterValueMaxDigits)
	}
	return nil
}

func digits(v int64) int {
	s := strconv.FormatInt(v, 10)
	if v < 0 {
		return len(s) - 1
	}
	return len(s)
}

// CheckMeterTimestamp reports whether Stripe takes an event of time ts when
// its clock reads now: within MeterEventMaxAge before now and
// MeterEventMaxFuture after. A caller validating with its own clock should
// leave itself a margin for the drift between its clock and Stripe's and
// for the time the event waits before it is sent.
func CheckMeterTimestamp(ts, now time.Time) error {
	switch {
	case ts.Before(now.Add(-MeterEventMaxAge)):
		return fmt.Errorf("%w: meter event timestamp %s is more than 35 days before %s", ErrInvalidRequest,
			ts.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	case ts.After(now.Add(MeterEventMaxFuture)):
		return fmt.Errorf("%w: meter event timestamp %s is more than 5 minutes after %s", ErrInvalidRequest,
			ts.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	return nil
}

// SendMeterEvent sends one meter event, through MeterLimiter when set (else
// the general limit) and stripe-go's retries. Errors:
//
//   - ErrDuplicateIdentifier: an event with this identifier exists: the
//     event was delivered before. Record it as delivered.
//   - ErrTransient: timeout, network, 5xx, 429 (the rate limits, and the
//     one-call-per-customer-per-meter rule), 409: the event may or may not
//     be recorded; send it again with the same Identifier while Stripe
//     still guards it (MeterIdentifierWindow after the first attempt).
//   - ErrInvalidRequest: refused (unknown meter, timestamp outside Stripe's
//     window, a bad value, too long an identifier — checked here before
//     sending); Error.Param names the parameter. Permanent.
//   - ErrIdempotencyMismatch: the identifier was sent before with other
//     parameters. A bug: never resend.
//   - ErrAuthentication, ErrPermission: the key.
func (c *Client) SendMeterEvent(ctx context.Context, ev MeterEvent) (MeterEventResult, error) {
	if err := ev.validate(); err != nil {
		return MeterEventResult{}, &Error{Kind: ErrInvalidRequest, Message: "meter event: " + err.Error(), Err: err}
	}
	var out MeterEventResult
	err := c.call(ctx, "meter_event", func(ctx context.Context) error {
		p := &stripe.BillingMeterEventParams{
			EventName: stripe.String(ev.EventName),
			Payload: map[string]string{
				"stripe_customer_id": ev.StripeCustomerID,
				"value":              strconv.FormatInt(ev.Value, 10),
			},
		}
		if ev.Identifier != "" {
			p.Identifier = stripe.String(ev.Identifier)
			p.SetIdempotencyKey(cmp.Or(ev.IdempotencyKey, "pelguard-meter:"+ev.Identifier))
		}
		if !ev.Timestamp.IsZero() {
			p.Timestamp = stripe.Int64(ev.Timestamp.Unix())
		}
		p.Context = ctx
		got, err := c.api.BillingMeterEvents.New(p)
		if err != nil {
			return meterEventError(err)
		}
		out = MeterEventResult{Identifier: got.Identifier, Timestamp: time.Unix(got.Timestamp, 0).UTC(),
			Created: time.Unix(got.Created, 0).UTC()}
		if got.LastResponse != nil {
			out.Replayed = got.LastResponse.Header.Get("Idempotent-Replayed") == "true"
		}
		return nil
	})
	if err != nil {
		return MeterEventResult{}, fmt.Errorf("sending meter event %s for %s (identifier %q): %w", ev.EventName, ev.StripeCustomerID, ev.Identifier, err)
	}
	return out, nil
}

// CancelMeterEvent cancels the event of eventName with identifier (a meter
// event adjustment of type cancel): it leaves the meter's totals. Stripe
// takes it only within MeterCancelWindow of receiving the event; a refusal
// (too old, unknown identifier) is ErrInvalidRequest. Its Idempotency-Key
// derives from the identifier, so a retry is answered from Stripe's record.
// It is an ordinary call: the general limit paces it, not MeterLimiter.
func (c *Client) CancelMeterEvent(ctx context.Context, eventName, identifier string) error {
	if eventName == "" || identifier == "" || len(identifier) > MeterIdentifierMaxLen {
		return &Error{Kind: ErrInvalidRequest, Message: fmt.Sprintf("cancel meter event: event name and an identifier of at most %d characters are required", MeterIdentifierMaxLen)}
	}
	err := c.call(ctx, "cancel_meter_event", func(ctx context.Context) error {
		p := &stripe.BillingMeterEventAdjustmentParams{
			EventName: stripe.String(eventName),
			Type:      stripe.String(string(stripe.BillingMeterEventAdjustmentTypeCancel)),
			Cancel:    &stripe.BillingMeterEventAdjustmentCancelParams{Identifier: stripe.String(identifier)},
		}
		p.Context = ctx
		p.SetIdempotencyKey("pelguard-meter-cancel:" + identifier)
		_, err := c.api.BillingMeterEventAdjustments.New(p)
		return err
	})
	if err != nil {
		return fmt.Errorf("cancelling meter event %s (identifier %q): %w", eventName, identifier, err)
	}
	return nil
}

// Meter is the adapter's view of a billing meter.
type Meter struct {
	ID          string
	DisplayName string
	EventName   string
	Formula     string // MeterFormulaSum, MeterFormulaCount or MeterFormulaLast
	CustomerKey string // payload key naming the customer
	ValueKey    string // payload key holding the value
	Status      string // active or inactive
	Created     time.Time
}

// MeterSpec is a meter to create. SendMeterEvent sends the default payload
// keys (stripe_customer_id, value): meters it feeds keep them.
type MeterSpec struct {
	DisplayName string // defaults to EventName
	EventName   string
	Formula     string // defaults to MeterFormulaSum
}

// CreateMeter creates a billing meter (tests, the drill, a first setup).
// Stripe allows one meter per event name.
func (c *Client) CreateMeter(ctx context.Context, spec MeterSpec) (Meter, error) {
	if spec.EventName == "" || len(spec.EventName) > MeterIdentifierMaxLen {
		return Meter{}, &Error{Kind: ErrInvalidRequest, Message: fmt.Sprintf("create meter: an event name of 1 to %d characters is required", MeterIdentifierMaxLen)}
	}
	var out Meter
	err := c.call(ctx, "create_meter", func(ctx context.Context) error {
		p := &stripe.BillingMeterParams{
			DisplayName:        stripe.String(cmp.Or(spec.DisplayName, spec.EventName)),
			EventName:          stripe.String(spec.EventName),
			DefaultAggregation: &stripe.BillingMeterDefaultAggregationParams{Formula: stripe.String(cmp.Or(spec.Formula, MeterFormulaSum))},
			CustomerMapping: &stripe.BillingMeterCustomerMappingParams{
				Type: stripe.String(string(stripe.BillingMeterCustomerMappingTypeByID)), EventPayloadKey: stripe.String("stripe_customer_id"),
			},
			ValueSettings: &stripe.BillingMeterValueSettingsParams{EventPayloadKey: stripe.String("value")},
		}
		p.Context = ctx
		m, err := c.api.BillingMeters.New(p)
		if err != nil {
			return err
		}
		out = toMeter(m)
		return nil
	})
	if err != nil {
		return Meter{}, fmt.Errorf("creating meter %s: %w", spec.EventName, err)
	}
	return out, nil
}

// ListMeters returns every billing meter of the account, newest first.
func (c *Client) ListMeters(ctx context.Context) ([]Meter, error) {
	var out []Meter
	err := c.call(ctx, "list_meters", func(ctx context.Context) error {
		out = out[:0]
		p := &stripe.BillingMeterListParams{}
		p.Context = ctx
		p.Limit = stripe.Int64(listPageSize)
		it := c.api.BillingMeters.List(p)
		for it.Next() {
			out = append(out, toMeter(it.BillingMeter()))
		}
		return it.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("listing meters: %w", err)
	}
	return out, nil
}

func toMeter(m *stripe.BillingMeter) Meter {
	out := Meter{ID: m.ID, DisplayName: m.DisplayName, EventName: m.EventName, Status: string(m.Status),
		Created: time.Unix(m.Created, 0).UTC()}
	if m.DefaultAggregation != nil {
		out.Formula = string(m.DefaultAggregation.Formula)
	}
	if m.CustomerMapping != nil {
		out.CustomerKey = m.CustomerMapping.EventPayloadKey
	}
	if m.ValueSettings != nil {
		out.ValueKey = m.ValueSettings.EventPayloadKey
	}
	return out
}

// MeterWindow groups event summaries.
type MeterWindow string

// Summary windows: MeterWindowNone asks for one summary of the whole range.
const (
	MeterWindowNone MeterWindow = ""
	MeterWindowHour MeterWindow = "hour"
	MeterWindowDay  MeterWindow = "day"
)

// MeterSummary is a meter's aggregate for one customer over [Start, End).
type MeterSummary struct {
	Start, End time.Time
	Value      float64
}

// MeterEventSummaries reads meterID's aggregates for customer over
// [start, end), one per hour or UTC day with window (Stripe requires start
// and end aligned with minutes, and with hours or UTC midnights for a
// window), oldest first. Stripe aggregates asynchronously: a summary may
// not include an event sent moments ago.
func (c *Client) MeterEventSummaries(ctx context.Context, meterID, customer string, start, end time.Time, window MeterWindow) ([]MeterSummary, error) {
	switch {
	case meterID == "" || customer == "":
		return nil, &Error{Kind: ErrInvalidRequest, Message: "meter event summaries: meter id and customer are required"}
	case !start.Before(end):
		return nil, &Error{Kind: ErrInvalidRequest, Message: fmt.Sprintf("meter event summaries: empty range [%s, %s)", start, end)}
	case window != MeterWindowNone && window != MeterWindowHour && window != MeterWindowDay:
		return nil, &Error{Kind: ErrInvalidRequest, Message: fmt.Sprintf("meter event summaries: window %q, want hour, day or none", window)}
	}
	var out []MeterSummary
	err := c.call(ctx, "meter_event_summaries", func(ctx context.Context) error {
		out = out[:0]
		p := &stripe.BillingMeterEventSummaryListParams{
			ID: stripe.String(meterID), Customer: stripe.String(customer),
			StartTime: stripe.Int64(start.Unix()), EndTime: stripe.Int64(end.Unix()),
		}
		if window != MeterWindowNone {
			p.ValueGroupingWindow = stripe.String(string(window))
		}
		p.Context = ctx
		p.Limit = stripe.Int64(listPageSize)
		it := c.api.BillingMeterEventSummaries.List(p)
		for it.Next() {
			s := it.BillingMeterEventSummary()
			out = append(out, MeterSummary{Start: time.Unix(s.StartTime, 0).UTC(), End: time.Unix(s.EndTime, 0).UTC(), Value: s.AggregatedValue})
		}
		return it.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("reading meter %s summaries of %s: %w", meterID, customer, err)
	}
	slices.SortFunc(out, func(a, b MeterSummary) int { return a.Start.Compare(b.Start) })
	return out, nil
}

// IsMissingMeter reports Stripe's refusal of a meter event for want of an
// active meter with its event_name ("No active meter found for
// event_name …": invalid_request_error, param event_name).
func IsMissingMeter(err error) bool {
	var se *Error
	return errors.As(err, &se) && errors.Is(se.Kind, ErrInvalidRequest) && se.Param == "event_name"
}
