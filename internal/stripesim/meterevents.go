package stripesim

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Meter events: POST /v1/billing/meter_events and
// POST /v1/billing/meter_event_adjustments. What Stripe does and where we
// know it from:
//
//   - event_name names an active meter; without one the call is refused
//     400 (reported: "No active meter found for event_name …"; Stripe also
//     documents an asynchronous no_meter error report, so the synchronous
//     refusal may not be all there is).
//   - payload holds the customer and the value under the meter's keys
//     (documented). The value: documented as the event's "numerical value";
//     Stripe's guidance once said whole numbers, and since API version
//     2026-04-22.dahlia a value of more than 15 significant digits is
//     refused 400 (documented, changelog). The emulator refuses anything but
//     a base-10 integer of at most 15 digits, sign allowed (assumed: strict,
//     pelguard's events carry integers; Stripe may accept decimals).
//     Negative values are accepted (assumed, not documented either way).
//   - identifier: at most 100 characters (documented); Stripe generates one
//     when none is sent (documented). A repeated identifier is refused
//     within "a rolling period of at least 24 hours" (documented); the
//     refusal is a 400 invalid_request_error with the message "An event
//     already exists with identifier <id>." (reported by users, not
//     documented: clients must match it loosely). The emulator keeps the
//     window at exactly MeterIdentifierWindow on its own clock (Advance
//     moves it), the least Stripe promises, and scopes identifiers to the
//     account across meters (assumed: the strictest reading).
//   - timestamp: within the past 35 calendar days and at most 5 minutes in
//     the future, default now (documented). Outside it the call is refused
//     400 (reported for the past: "The event timestamp cannot be more than
//     35 days in past. Expected a timestamp greater than or equal to N.";
//     the future message is ours).
//   - one concurrent call per customer per meter (documented, under
//     Stripe's concurrency limiter, whose refusals are 429s). What Stripe
//     answers a second concurrent call is not documented and no report was
//     found: the emulator answers 429 rate_limit, as its other limiters do
//     (assumed).
//   - an unknown customer is not refused: Stripe validates it after the 200
//     and reports meter_event_customer_not_found in a
//     v1.billing.meter.error_report_triggered event (documented event type
//     and code). With Config.RequireCustomers the emulator does the same:
//     200, nothing counted, a MeterErrorReport.
//   - adjustments: type cancel with cancel[identifier] and event_name
//     (documented, required); "only events sent to Stripe within the last
//     24 hours" (documented). Refusals (unknown identifier, too old) are
//     400s with our messages (assumed); cancelling twice is a no-op 200
//     (assumed). A cancelled event leaves the summaries (documented:
//     "cancel incorrectly reported events").
//   - there is no API to list or retrieve individual meter events
//     (documented by absence: the API reference has create only); tests
//     read them through MeterEvents.

// Stripe's documented meter-event windows.
const (
	// MeterIdentifierWindow is how long an identifier is refused after
	// the event that used it was received: Stripe promises "at least 24
	// hours"; the emulator gives exactly that.
	MeterIdentifierWindow = 24 * time.Hour
	// MeterCancelWindow is how long after its receipt an event can be
	// cancelled.
	MeterCancelWindow = 24 * time.Hour
	// MeterEventMaxAge and MeterEventMaxFuture bound an event's
	// timestamp around the emulator's now.
	MeterEventMaxAge    = 35 * 24 * time.Hour
	MeterEventMaxFuture = 5 * time.Minute
	// maxValueDigits is Stripe's limit on a value's significant digits.
	maxValueDigits = 15
)

// meterEvent is one recorded meter event.
type meterEvent struct {
	seq        uint64
	meter      string // meter id
	eventName  string
	identifier string
	customer   string
	value      int64
	timestamp  int64 // the event's time (Unix seconds), as sent or defaulted
	received   time.Time
	payload    map[string]string
	livemode   bool
	cancelled  bool
}

// MeterEvent is a recorded meter event as the inspection API reports it.
type MeterEvent struct {
	Identifier string
	EventName  string
	Customer   string
	Value      int64
	Timestamp  time.Time // the event's time
	Received   time.Time // when the emulator recorded it
	Cancelled  bool
}

func (e *meterEvent) export() MeterEvent {
	return MeterEvent{Identifier: e.identifier, EventName: e.eventName, Customer: e.customer, Value: e.value,
		Timestamp: time.Unix(e.timestamp, 0).UTC(), Received: e.received, Cancelled: e.cancelled}
}

// MeterErrorReport is an event Stripe answered 200 and then rejected, as a
// v1.billing.meter.error_report_triggered event would report it.
type MeterErrorReport struct {
	Code       string // meter_event_customer_not_found, stripesim_injected
	EventName  string
	Customer   string
	Identifier string
	At         time.Time
}

// MeterEventCounts counts what POST /v1/billing/meter_events answered.
type MeterEventCounts struct {
	Recorded    int64 // recorded (counted unless later cancelled)
	Duplicates  int64 // refused 400: identifier used within the window
	Concurrent  int64 // refused 429: a call for the customer and meter was in flight
	RateLimited int64 // refused 429 by RateLimit or MeterEventRateLimit
	Invalid     int64 // refused 400 otherwise (meter, value, timestamp, …)
	Rejected    int64 // answered 200, then dropped with a MeterErrorReport
	Cancelled   int64 // cancelled by an adjustment
}

// meterEventParams are a meter event's validated parameters.
type meterEventParams struct {
	meter      *billingMeter
	identifier string
	customer   string
	value      int64
	timestamp  int64
	payload    map[string]string
}

// parseMeterEvent validates a meter event against its meter and the
// emulator's clock; a non-zero response is the refusal.
func (s *Server) parseMeterEvent(c *apiCall, now time.Time) (meterEventParams, response) {
	var p meterEventParams
	f := c.form
	name := f.get("event_name")
	switch {
	case name == "":
		return p, paramMissing("event_name")
	case len(name) > maxMeterName:
		return p, invalidRequest(http.StatusBadRequest, "event_name",
			fmt.Sprintf("Invalid event_name: must be at most %d characters long.", maxMeterName))
	}
	p.identifier = f.get("identifier")
	if len(p.identifier) > maxMeterName {
		return p, invalidRequest(http.StatusBadRequest, "identifier",
			fmt.Sprintf("Invalid identifier: must be at most %d characters long.", maxMeterName))
	}
	s.meters.mu.Lock()
	p.meter = s.meters.meterOf(name)
	s.meters.mu.Unlock()
	if p.meter == nil {
		return p, invalidRequest(http.StatusBadRequest, "event_name", fmt.Sprintf("No active meter found for event_name %s.", name))
	}
	p.payload = f.sub("payload")
	p.customer = p.payload[p.meter.customerKey]
	if p.customer == "" {
		return p, paramMissing("payload[" + p.meter.customerKey + "]")
	}
	raw, hasValue := p.payload[p.meter.valueKey]
	switch {
	case !hasValue && p.meter.formula == FormulaCount:
		p.value = 1 // a count meter counts the event, whatever its value (assumed)
	case !hasValue:
		return p, paramMissing("payload[" + p.meter.valueKey + "]")
	default:
		v, resp := parseMeterValue(p.meter.valueKey, raw)
		if resp.status != 0 {
			return p, resp
		}
		p.value = v
	}
	p.timestamp = now.Unix()
	if ts, ok, resp := f.int64Param("timestamp"); resp.status != 0 {
		return p, resp
	} else if ok {
		p.timestamp = ts
	}
	if oldest := now.Add(-MeterEventMaxAge).Unix(); p.timestamp < oldest {
		return p, invalidRequest(http.StatusBadRequest, "timestamp", fmt.Sprintf(
			"The event timestamp cannot be more than 35 days in past. Expected a timestamp greater than or equal to %d.", oldest))
	}
	if latest := now.Add(MeterEventMaxFuture).Unix(); p.timestamp > latest {
		return p, invalidRequest(http.StatusBadRequest, "timestamp", fmt.Sprintf(
			"The event timestamp cannot be more than 5 minutes in the future. Expected a timestamp less than or equal to %d.", latest))
	}
	return p, response{}
}

// parseMeterValue accepts a base-10 integer of at most 15 digits, with an
// optional sign. The form encoding would carry "2.5" or "1e3" just as well:
// those are refused.
func parseMeterValue(key, raw string) (int64, response) {
	digits := strings.TrimLeft(raw, "+-")
	v, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || len(raw)-len(digits) > 1 {
		return 0, invalidRequest(http.StatusBadRequest, "payload["+key+"]",
			fmt.Sprintf("Invalid payload[%s]: %q is not a whole number.", key, raw))
	}
	if len(strings.TrimLeft(digits, "0")) > maxValueDigits {
		return 0, invalidRequest(http.StatusBadRequest, "payload["+key+"]",
			fmt.Sprintf("The value in the event payload can have at most %d digits. Received %s.", maxValueDigits, raw))
	}
	return v, response{}
}

// createMeterEvent serves POST /v1/billing/meter_events: validate, take the
// customer-and-meter slot (429 when another call holds it), stay in flight
// for MeterEventLatency, then record the event unless its identifier was
// used within the window.
func (s *Server) createMeterEvent(c *apiCall) response {
	ms := s.meters
	p, resp := s.parseMeterEvent(c, s.Now())
	if resp.status != 0 {
		ms.count(func(n *MeterEventCounts) { n.Invalid++ })
		return resp
	}
	key := flightKey{p.meter.id, p.customer}
	ms.mu.Lock()
	if ms.inFlight[key] {
		ms.counts.Concurrent++
		ms.mu.Unlock()
		return concurrentMeterEvent(p.customer, p.meter.eventName)
	}
	ms.inFlight[key] = true
	ms.mu.Unlock()
	defer func() {
		ms.mu.Lock()
		delete(ms.inFlight, key)
		ms.mu.Unlock()
	}()

	if hook := s.cfg.OnMeterEventInFlight; hook != nil {
		hook(p.customer, p.meter.eventName)
	}
	if d := s.faults.current().MeterEventLatency; d > 0 {
		// Not woken by the client going away: Stripe finishes a request
		// whose client timed out, and so does the emulator.
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-s.closing:
		}
		t.Stop()
	}
	return s.recordMeterEvent(c, p)
}

// concurrentMeterEvent is the emulator's answer to a second concurrent call
// for one customer and meter. Stripe documents the limit, not the answer:
// a 429 like its other limiters' (assumed).
func concurrentMeterEvent(customer, eventName string) response {
	return errorResp(http.StatusTooManyRequests, stripeError{
		Type: "invalid_request_error", Code: "rate_limit",
		Message: fmt.Sprintf("Too many concurrent requests for customer %s and meter event %s: "+
			"the meter events endpoint allows one concurrent call per customer per meter.", customer, eventName),
	})
}

// recordMeterEvent records p, or refuses a repeated identifier.
func (s *Server) recordMeterEvent(c *apiCall, p meterEventParams) response {
	ms := s.meters
	now := s.Now()
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if p.identifier != "" {
		if prev := ms.byIdent[p.identifier]; prev != nil && now.Sub(prev.received) < MeterIdentifierWindow {
			ms.counts.Duplicates++
			return invalidRequest(http.StatusBadRequest, "identifier",
				fmt.Sprintf("An event already exists with identifier %s.", p.identifier))
		}
	}
	ms.seq++
	ev := &meterEvent{
		seq: ms.seq, meter: p.meter.id, eventName: p.meter.eventName, identifier: p.identifier,
		customer: p.customer, value: p.value, timestamp: p.timestamp, received: now,
		payload: p.payload, livemode: c.livemode,
	}
	if ev.identifier == "" {
		ev.identifier = fmt.Sprintf("sim_mev_%012d", ms.seq) // Stripe generates one (documented)
	}
	resp := jsonResp(ev.json())
	code := ""
	switch {
	case takeOne(&s.faults.rejectMeter):
		code = "stripesim_injected"
	case s.cfg.RequireCustomers && !s.customerExists(p.customer):
		code = "meter_event_customer_not_found"
	}
	if code != "" {
		ms.counts.Rejected++
		ms.reports = append(ms.reports, MeterErrorReport{Code: code, EventName: ev.eventName,
			Customer: ev.customer, Identifier: ev.identifier, At: now})
		return resp
	}
	ms.counts.Recorded++
	ms.events = append(ms.events, ev)
	ms.byIdent[ev.identifier] = ev
	k := flightKey{ev.meter, ev.customer}
	ms.byKey[k] = append(ms.byKey[k], ev)
	resp.createdMeterEvent = true
	return resp
}

func (s *Server) customerExists(id string) bool {
	s.store.mu.RLock()
	defer s.store.mu.RUnlock()
	_, ok := s.store.customers[id]
	return ok
}

// createMeterAdjustment serves POST /v1/billing/meter_event_adjustments
// (type cancel): the event with cancel[identifier] leaves the summaries,
// if Stripe received it within MeterCancelWindow.
func (s *Server) createMeterAdjustment(c *apiCall) response {
	f := c.form
	name, typ, ident := f.get("event_name"), f.get("type"), f.get("cancel[identifier]")
	switch {
	case name == "":
		return paramMissing("event_name")
	case typ == "":
		return paramMissing("type")
	case typ != "cancel":
		return invalidRequest(http.StatusBadRequest, "type", "Invalid type: must be cancel")
	case ident == "":
		return paramMissing("cancel[identifier]")
	}
	now := s.Now()
	ms := s.meters
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.meterOf(name) == nil {
		return invalidRequest(http.StatusBadRequest, "event_name", fmt.Sprintf("No active meter found for event_name %s.", name))
	}
	ev := ms.byIdent[ident]
	if ev == nil || ev.eventName != name {
		return invalidRequest(http.StatusBadRequest, "cancel[identifier]",
			fmt.Sprintf("No meter event found with identifier %s for event_name %s.", ident, name))
	}
	if now.Sub(ev.received) >= MeterCancelWindow {
		return invalidRequest(http.StatusBadRequest, "cancel[identifier]", fmt.Sprintf(
			"Meter event %s cannot be canceled: events can only be canceled within 24 hours of Stripe receiving them.", ident))
	}
	if !ev.cancelled {
		ev.cancelled = true
		ms.counts.Cancelled++
	}
	out := map[string]any{
		"object": "billing.meter_event_adjustment", "livemode": c.livemode, "status": "complete",
		"event_name": name, "type": "cancel", "cancel": map[string]string{"identifier": ident},
	}
	return jsonResp(out)
}

type meterEventJSON struct {
	Object     string            `json:"object"`
	Created    int64             `json:"created"`
	EventName  string            `json:"event_name"`
	Identifier string            `json:"identifier"`
	Livemode   bool              `json:"livemode"`
	Payload    map[string]string `json:"payload"`
	Timestamp  int64             `json:"timestamp"`
}

func (e *meterEvent) json() meterEventJSON {
	return meterEventJSON{Object: "billing.meter_event", Created: e.received.Unix(), EventName: e.eventName,
		Identifier: e.identifier, Livemode: e.livemode, Payload: nonNil(e.payload), Timestamp: e.timestamp}
}
