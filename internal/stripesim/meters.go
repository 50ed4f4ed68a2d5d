package stripesim

import (
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Billing meters (Stripe Billing's usage-based billing): meters, meter
// events, meter event adjustments and event summaries, as
// docs.stripe.com/api/billing/meter* and stripe-go v76.25.0's billing/meter*
// packages describe them. Each rule below says where it comes from:
// "documented" (Stripe's docs), "reported" (by users, not in Stripe's docs)
// or "assumed" (neither: our choice, kept strict where Stripe is unclear).
//
// One namespace for test and live keys, like the rest of the emulator: a
// meter made with a test key is found with a live key.

// Meter formulas (default_aggregation[formula]). Documented: sum, count and
// last (stripe-go v76.25.0's params doc names all three; its response enum
// only sum and count).
const (
	FormulaSum   = "sum"
	FormulaCount = "count"
	FormulaLast  = "last"
)

// Default payload keys of a meter (documented: customer_mapping's
// event_payload_key defaults to stripe_customer_id, value_settings' to value).
const (
	DefaultCustomerKey = "stripe_customer_id"
	DefaultValueKey    = "value"
)

const (
	metersPath      = "/v1/billing/meters"
	meterEventsPath = "/v1/billing/meter_events"
	// maxMeterName is Stripe's maximum length of a meter event's
	// event_name and identifier (documented: "Max length: 100").
	maxMeterName = 100
)

// billingMeter is a Stripe billing meter.
type billingMeter struct {
	id          string
	seq         uint64
	created     int64
	displayName string
	eventName   string
	formula     string
	customerKey string
	valueKey    string
	livemode    bool
}

func (m *billingMeter) sortKey() sortKey { return sortKey{m.created, m.seq} }

// flightKey names one customer of one meter: the unit of Stripe's
// one-concurrent-call rule and of the summaries.
type flightKey struct {
	meter    string // meter id
	customer string
}

// meterStore holds meters and meter events under one mutex of its own, so
// the meter-event path never contends with charges. Every critical section
// is a few map operations; summaries scan one customer's events of one meter.
type meterStore struct {
	mu       sync.Mutex
	seq      uint64
	meters   map[string]*billingMeter
	all      index[*billingMeter]
	byEvent  map[string]*billingMeter // event_name → its (active) meter
	events   []*meterEvent            // every recorded event, in arrival order
	byKey    map[flightKey][]*meterEvent
	byIdent  map[string]*meterEvent // identifier → latest event that used it
	inFlight map[flightKey]bool
	reports  []MeterErrorReport
	counts   MeterEventCounts
}

func newMeterStore() *meterStore {
	return &meterStore{
		meters: make(map[string]*billingMeter), byEvent: make(map[string]*billingMeter),
		byKey: make(map[flightKey][]*meterEvent), byIdent: make(map[string]*meterEvent),
		inFlight: make(map[flightKey]bool),
	}
}

// drop forgets every meter and event (ids keep counting up).
func (ms *meterStore) drop() {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	fresh := newMeterStore()
	ms.meters, ms.byEvent, ms.byKey, ms.byIdent = fresh.meters, fresh.byEvent, fresh.byKey, fresh.byIdent
	ms.inFlight, ms.all, ms.events, ms.reports = fresh.inFlight, index[*billingMeter]{}, nil, nil
}

func (ms *meterStore) count(f func(*MeterEventCounts)) {
	ms.mu.Lock()
	f(&ms.counts)
	ms.mu.Unlock()
}

// BillingMeter is a billing meter as the inspection API reports it (Meter
// is the request recorder in meter.go).
type BillingMeter struct {
	ID          string
	DisplayName string
	EventName   string
	Formula     string // FormulaSum, FormulaCount or FormulaLast
	CustomerKey string // the payload key naming the customer
	ValueKey    string // the payload key holding the value
	Created     time.Time
}

// BillingMeterSeed describes a meter to create without HTTP.
type BillingMeterSeed struct {
	DisplayName string // defaults to EventName
	EventName   string
	Formula     string // defaults to FormulaSum
	CustomerKey string // defaults to DefaultCustomerKey
	ValueKey    string // defaults to DefaultValueKey
}

// CreateBillingMeter stores a meter directly (no HTTP, no faults). It
// returns an error for what POST /v1/billing/meters refuses: an empty or
// over-long event name, an unknown formula, an event name that already has
// a meter.
func (s *Server) CreateBillingMeter(seed BillingMeterSeed) (BillingMeter, error) {
	m := &billingMeter{
		displayName: seed.DisplayName, eventName: seed.EventName, formula: seed.Formula,
		customerKey: seed.CustomerKey, valueKey: seed.ValueKey,
	}
	if m.displayName == "" {
		m.displayName = m.eventName
	}
	if m.formula == "" {
		m.formula = FormulaSum
	}
	if resp := s.addMeter(m); resp.status != 0 {
		return BillingMeter{}, fmt.Errorf("stripesim: creating meter %q: %s", seed.EventName, resp.body)
	}
	return m.export(), nil
}

// addMeter validates and stores m, filling defaults, id and created; a
// non-zero response is Stripe's refusal.
func (s *Server) addMeter(m *billingMeter) response {
	switch {
	case m.displayName == "":
		return paramMissing("display_name")
	case m.eventName == "":
		return paramMissing("event_name")
	case len(m.eventName) > maxMeterName:
		return invalidRequest(http.StatusBadRequest, "event_name",
			fmt.Sprintf("Invalid event_name: must be at most %d characters long.", maxMeterName))
	case m.formula != FormulaSum && m.formula != FormulaCount && m.formula != FormulaLast:
		return invalidRequest(http.StatusBadRequest, "default_aggregation[formula]",
			fmt.Sprintf("Invalid default_aggregation[formula]: must be one of %s, %s or %s", FormulaSum, FormulaCount, FormulaLast))
	}
	if m.customerKey == "" {
		m.customerKey = DefaultCustomerKey
	}
	if m.valueKey == "" {
		m.valueKey = DefaultValueKey
	}
	ms := s.meters
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if other := ms.byEvent[m.eventName]; other != nil {
		// Documented: "You can only use an event name with a single
		// meter". The message is ours.
		return invalidRequest(http.StatusBadRequest, "event_name",
			fmt.Sprintf("An active meter already exists with event_name %s: %s.", m.eventName, other.id))
	}
	ms.seq++
	m.seq, m.created = ms.seq, s.Now().Unix()
	m.id = fmt.Sprintf("mtr_sim%012d", ms.seq)
	ms.meters[m.id] = m
	ms.byEvent[m.eventName] = m
	ms.all.add(m)
	return response{}
}

func (m *billingMeter) export() BillingMeter {
	return BillingMeter{
		ID: m.id, DisplayName: m.displayName, EventName: m.eventName, Formula: m.formula,
		CustomerKey: m.customerKey, ValueKey: m.valueKey, Created: time.Unix(m.created, 0).UTC(),
	}
}

// BillingMeters returns every meter, oldest first.
func (s *Server) BillingMeters() []BillingMeter {
	ms := s.meters
	ms.mu.Lock()
	defer ms.mu.Unlock()
	ms.all.sort()
	out := make([]BillingMeter, len(ms.all.items))
	for i, m := range ms.all.items {
		out[i] = m.export()
	}
	return out
}

// createMeter serves POST /v1/billing/meters: display_name, event_name,
// default_aggregation[formula], customer_mapping[event_payload_key|type]
// and value_settings[event_payload_key] (documented). event_time_window
// (pre-aggregated meters: only the newest event of each hour or day
// counts) is not modelled: it is refused rather than ignored, so no test
// reads totals the emulator would compute wrongly.
func (s *Server) createMeter(c *apiCall) response {
	f := c.form
	if f.get("event_time_window") != "" {
		return invalidRequest(http.StatusBadRequest, "event_time_window",
			"stripesim does not model pre-aggregated meters (event_time_window): create the meter without it.")
	}
	if t := f.get("customer_mapping[type]"); t != "" && t != "by_id" {
		return invalidRequest(http.StatusBadRequest, "customer_mapping[type]", "Invalid customer_mapping[type]: must be by_id")
	}
	m := &billingMeter{
		displayName: f.get("display_name"), eventName: f.get("event_name"),
		formula:     f.get("default_aggregation[formula]"),
		customerKey: f.get("customer_mapping[event_payload_key]"), valueKey: f.get("value_settings[event_payload_key]"),
		livemode: c.livemode,
	}
	if m.formula == "" {
		return paramMissing("default_aggregation[formula]")
	}
	if resp := s.addMeter(m); resp.status != 0 {
		return resp
	}
	return jsonResp(m.json())
}

func (s *Server) getMeter(c *apiCall) response {
	ms := s.meters
	ms.mu.Lock()
	defer ms.mu.Unlock()
	m := ms.meters[c.id]
	if m == nil {
		return missing("billing.meter", "id", c.id)
	}
	return jsonResp(m.json())
}

// listMeters serves GET /v1/billing/meters, newest first, with status
// (every meter is active: deactivation is not modelled) and cursors.
func (s *Server) listMeters(c *apiCall) response {
	q, resp, ok := parseListQuery(c.form)
	if !ok {
		return resp
	}
	status := c.form.get("status")
	if status != "" && status != "active" && status != "inactive" {
		return invalidRequest(http.StatusBadRequest, "status", "Invalid status: must be one of active or inactive")
	}
	ms := s.meters
	ms.mu.Lock()
	defer ms.mu.Unlock()
	ms.all.sort()
	var cursor *sortKey
	if id := q.startingAfter + q.endingBefore; id != "" {
		m := ms.meters[id]
		if m == nil {
			resp := missing("billing.meter", cmpParam(q), id)
			resp.status = http.StatusBadRequest
			return resp
		}
		k := m.sortKey()
		cursor = &k
	}
	env := listEnvelope{Object: "list", URL: metersPath, Data: []any{}}
	if status != "inactive" {
		items, more := page(ms.all.items, q, cursor)
		env.HasMore = more
		for _, m := range items {
			env.Data = append(env.Data, m.json())
		}
	}
	return jsonResp(env)
}

// --- JSON shapes, as stripe-go v76 decodes them and stripe-mock answers ---

type meterJSON struct {
	ID              string `json:"id"`
	Object          string `json:"object"`
	Created         int64  `json:"created"`
	CustomerMapping struct {
		EventPayloadKey string `json:"event_payload_key"`
		Type            string `json:"type"`
	} `json:"customer_mapping"`
	DefaultAggregation struct {
		Formula string `json:"formula"`
	} `json:"default_aggregation"`
	DisplayName       string  `json:"display_name"`
	EventName         string  `json:"event_name"`
	EventTimeWindow   *string `json:"event_time_window"`
	Livemode          bool    `json:"livemode"`
	Status            string  `json:"status"`
	StatusTransitions struct {
		DeactivatedAt *int64 `json:"deactivated_at"`
	} `json:"status_transitions"`
	Updated       int64 `json:"updated"`
	ValueSettings struct {
		EventPayloadKey string `json:"event_payload_key"`
	} `json:"value_settings"`
}

func (m *billingMeter) json() meterJSON {
	out := meterJSON{
		ID: m.id, Object: "billing.meter", Created: m.created, DisplayName: m.displayName,
		EventName: m.eventName, Livemode: m.livemode, Status: "active", Updated: m.created,
	}
	out.CustomerMapping.EventPayloadKey, out.CustomerMapping.Type = m.customerKey, "by_id"
	out.DefaultAggregation.Formula = m.formula
	out.ValueSettings.EventPayloadKey = m.valueKey
	return out
}

func paramMissing(param string) response {
	return errorResp(http.StatusBadRequest, stripeError{Type: "invalid_request_error", Code: "parameter_missing",
		Param: param, Message: "Missing required param: " + param + "."})
}

// meterOf returns the meter of an event name; callers hold the lock.
func (ms *meterStore) meterOf(eventName string) *billingMeter { return ms.byEvent[eventName] }

// sortedEvents returns a copy of evs sorted by timestamp, ties by arrival.
func sortedEvents(evs []*meterEvent) []*meterEvent {
	out := slices.Clone(evs)
	slices.SortStableFunc(out, func(a, b *meterEvent) int {
		switch {
		case a.timestamp < b.timestamp:
			return -1
		case a.timestamp > b.timestamp:
			return 1
		}
		return 0
	})
	return out
}
