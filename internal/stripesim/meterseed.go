package stripesim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// MeterEventSeed is one meter event of POST /_sim/meter_seed: the bulk seed
// of a separate emulator process (the usage reconciliation's benchmark
// gives it a month of usage in seconds, not in a million POSTs). Timestamp
// is in Unix seconds. A seeded event is recorded as received now, with no
// identifier of its own (it is never deduplicated against) and no check of
// its value or timestamp.
type MeterEventSeed struct {
	EventName string `json:"event_name"`
	Customer  string `json:"customer"`
	Value     int64  `json:"value"`
	Timestamp int64  `json:"timestamp"`
}

// SeedMeterEvent records seed directly (no HTTP, no faults): an error when
// its meter does not exist.
func (s *Server) SeedMeterEvent(seed MeterEventSeed) error {
	ms := s.meters
	now := s.Now()
	ms.mu.Lock()
	defer ms.mu.Unlock()
	m := ms.meterOf(seed.EventName)
	if m == nil {
		return fmt.Errorf("stripesim: seeding a meter event: no meter has event name %q", seed.EventName)
	}
	ms.seq++
	ev := &meterEvent{seq: ms.seq, meter: m.id, eventName: m.eventName, customer: seed.Customer, value: seed.Value,
		timestamp: seed.Timestamp, received: now}
	ms.counts.Recorded++
	ms.events = append(ms.events, ev)
	k := flightKey{ev.meter, ev.customer}
	ms.byKey[k] = append(ms.byKey[k], ev)
	return nil
}

// serveMeterSeed answers POST /_sim/meter_seed, a JSON array of
// MeterEventSeed, decoded one element at a time; it returns how many were
// recorded.
func (s *Server) serveMeterSeed(r *http.Request) (int, any, bool) {
	if r.Method != http.MethodPost || r.URL.Path != "/_sim/meter_seed" {
		return 0, nil, false
	}
	dec := json.NewDecoder(r.Body)
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return http.StatusBadRequest, map[string]string{"error": "meter seed: the body must be a JSON array of meter events"}, true
	}
	n := 0
	for dec.More() {
		var j MeterEventSeed
		if err := dec.Decode(&j); err != nil {
			return http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("meter seed: event %d: %v", n, err)}, true
		}
		if err := s.SeedMeterEvent(j); err != nil {
			return http.StatusBadRequest, map[string]string{"error": err.Error()}, true
		}
		n++
	}
	return http.StatusOK, map[string]any{"seeded": n, "at": s.Now().Format(time.RFC3339)}, true
}
