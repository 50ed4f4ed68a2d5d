package stripesim

import (
	"fmt"
	"net/http"
	"slices"
)

// Meter event summaries: GET /v1/billing/meters/{id}/event_summaries.
// Documented: customer, start_time (inclusive) and end_time (exclusive)
// are required and aligned with minute boundaries; value_grouping_window
// hour or day asks for one summary per hour or UTC day, and then start and
// end must be aligned with hours or UTC midnights; without it one summary
// covers the whole range; aggregated_value is a float; summaries are
// eventually consistent at Stripe (the emulator's are immediate, or lag by
// Faults.MeterSummaryLag: an event counts once received that long ago). Assumed:
// with a window, hours or days without an event are left out (Stripe's docs
// do not say); the refusals' messages are ours. Summaries come newest
// first, as in Stripe's example.

// summary is one window's aggregate.
type summary struct {
	start, end int64
	value      float64
}

func (m summary) id() string { return fmt.Sprintf("mtrusg_sim_%d_%d", m.start, m.end) }

var windowSeconds = map[string]int64{"hour": 3600, "day": 86400}

func (s *Server) listMeterSummaries(c *apiCall) response {
	f := c.form
	q, resp, ok := parseListQuery(f)
	if !ok {
		return resp
	}
	customer := f.get("customer")
	if customer == "" {
		return paramMissing("customer")
	}
	var bounds [2]int64
	for i, param := range []string{"start_time", "end_time"} {
		v, ok, resp := f.int64Param(param)
		switch {
		case resp.status != 0:
			return resp
		case !ok:
			return paramMissing(param)
		case v%60 != 0:
			return invalidRequest(http.StatusBadRequest, param, fmt.Sprintf("Invalid %s: must be aligned with minute boundaries.", param))
		}
		bounds[i] = v
	}
	start, end := bounds[0], bounds[1]
	if start >= end {
		return invalidRequest(http.StatusBadRequest, "end_time", "Invalid end_time: must be after start_time.")
	}
	window := f.get("value_grouping_window")
	width, known := windowSeconds[window]
	switch {
	case window == "":
		width = end - start
	case !known:
		return invalidRequest(http.StatusBadRequest, "value_grouping_window", "Invalid value_grouping_window: must be one of hour or day")
	case start%width != 0 || end%width != 0:
		return invalidRequest(http.StatusBadRequest, "value_grouping_window", fmt.Sprintf(
			"For value_grouping_window %s, start_time and end_time must be aligned with %s boundaries (UTC).", window, window))
	}

	ms := s.meters
	ms.mu.Lock()
	m := ms.meters[c.id]
	if m == nil {
		ms.mu.Unlock()
		return missing("billing.meter", "id", c.id)
	}
	evs := sortedEvents(ms.byKey[flightKey{m.id, customer}])
	ms.mu.Unlock()
	visibleBy := s.Now().Add(-s.faults.current().MeterSummaryLag)

	// Events are sorted by timestamp, so each window's events are
	// contiguous and "last" is the last one seen.
	var sums []summary // oldest first
	counts := 0
	for _, e := range evs {
		if e.cancelled || e.timestamp < start || e.timestamp >= end || e.received.After(visibleBy) {
			continue
		}
		ws := start + (e.timestamp-start)/width*width
		if n := len(sums); n == 0 || sums[n-1].start != ws {
			sums = append(sums, summary{start: ws, end: min(ws+width, end)})
			counts = 0
		}
		cur := &sums[len(sums)-1]
		counts++
		switch m.formula {
		case FormulaSum:
			cur.value += float64(e.value)
		case FormulaCount:
			cur.value = float64(counts)
		case FormulaLast:
			cur.value = float64(e.value)
		}
	}
	if window == "" && len(sums) == 0 {
		sums = []summary{{start: start, end: end}} // one summary for the range, always
	}
	slices.Reverse(sums) // newest first
	return summaryPage(m, c.livemode, sums, q)
}

// summaryPage serves one page of sums (newest first) with Stripe's
// cursors, which name a summary id.
func summaryPage(m *billingMeter, livemode bool, sums []summary, q listQuery) response {
	lo, hi := 0, len(sums)
	if id := q.startingAfter + q.endingBefore; id != "" {
		i := slices.IndexFunc(sums, func(x summary) bool { return x.id() == id })
		if i < 0 {
			resp := missing("billing.meter_event_summary", cmpParam(q), id)
			resp.status = http.StatusBadRequest
			return resp
		}
		if q.startingAfter != "" {
			lo = i + 1
		} else {
			hi = i
		}
	}
	var from, to int
	if q.endingBefore != "" {
		from, to = max(lo, hi-q.limit), hi
	} else {
		from, to = lo, min(hi, lo+q.limit)
	}
	// Newer summaries than the page are left when it ends before the
	// cursor; older ones when it starts after it.
	env := listEnvelope{Object: "list", HasMore: to < hi, Data: []any{}, URL: metersPath + "/" + m.id + "/event_summaries"}
	if q.endingBefore != "" {
		env.HasMore = from > lo
	}
	for _, x := range sums[from:to] {
		env.Data = append(env.Data, map[string]any{
			"id": x.id(), "object": "billing.meter_event_summary", "aggregated_value": x.value,
			"start_time": x.start, "end_time": x.end, "livemode": livemode, "meter": m.id,
		})
	}
	return jsonResp(env)
}

// MeterTotal is what the meter of eventName bills customer for over every
// recorded, uncancelled event: the sum of their values, their count, or the
// value of the latest by timestamp, as the meter's formula says. 0 when
// the meter or the events do not exist.
func (s *Server) MeterTotal(eventName, customer string) int64 {
	ms := s.meters
	ms.mu.Lock()
	m := ms.meterOf(eventName)
	if m == nil {
		ms.mu.Unlock()
		return 0
	}
	evs := sortedEvents(ms.byKey[flightKey{m.id, customer}])
	ms.mu.Unlock()
	var total int64
	for _, e := range evs {
		if e.cancelled {
			continue
		}
		switch m.formula {
		case FormulaSum:
			total += e.value
		case FormulaCount:
			total++
		case FormulaLast:
			total = e.value
		}
	}
	return total
}

// MeterEvents returns the recorded meter events of eventName and customer
// ("" matches any), cancelled ones included, in the order they were
// recorded. Stripe has no API for this: it is the emulator's own view.
func (s *Server) MeterEvents(eventName, customer string) []MeterEvent {
	ms := s.meters
	ms.mu.Lock()
	defer ms.mu.Unlock()
	var out []MeterEvent
	for _, e := range ms.events {
		if (eventName == "" || e.eventName == eventName) && (customer == "" || e.customer == customer) {
			out = append(out, e.export())
		}
	}
	return out
}

// MeterErrorReports returns the meter events answered 200 and then
// rejected, oldest first.
func (s *Server) MeterErrorReports() []MeterErrorReport {
	ms := s.meters
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return slices.Clone(ms.reports)
}

// MeterEventCounts counts the answers to POST /v1/billing/meter_events and
// the cancellations so far.
func (s *Server) MeterEventCounts() MeterEventCounts {
	ms := s.meters
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.counts
}

// serveMeters answers GET /_sim/meters and GET /_sim/meter_events.
func (s *Server) serveMeters(r *http.Request) (int, any, bool) {
	if r.Method != http.MethodGet {
		return 0, nil, false
	}
	switch r.URL.Path {
	case "/_sim/meters":
		return http.StatusOK, map[string]any{
			"meters": s.BillingMeters(), "counts": s.MeterEventCounts(), "error_reports": s.MeterErrorReports(),
		}, true
	case "/_sim/meter_events":
		name, cus := r.URL.Query().Get("event_name"), r.URL.Query().Get("customer")
		out := map[string]any{"events": s.MeterEvents(name, cus)}
		if name != "" && cus != "" {
			out["total"] = s.MeterTotal(name, cus)
		}
		return http.StatusOK, out, true
	}
	return 0, nil, false
}
