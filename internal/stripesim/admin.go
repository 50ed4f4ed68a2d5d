package stripesim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// FaultsJSON is the wire form of Faults for POST/GET /_sim/faults: the same
// fields in snake_case, durations as Go duration strings ("250ms").
type FaultsJSON struct {
	Latency struct {
		Fixed    string  `json:"fixed,omitempty"`
		Min      string  `json:"min,omitempty"`
		Max      string  `json:"max,omitempty"`
		TailProb float64 `json:"tail_prob,omitempty"`
		Tail     string  `json:"tail,omitempty"`
	} `json:"latency"`
	PageLatency      map[string]string `json:"page_latency,omitempty"`
	ErrorRate        float64           `json:"error_rate,omitempty"`
	ErrorShouldRetry bool              `json:"error_should_retry,omitempty"`
	RateLimitedRate  float64           `json:"rate_limited_rate,omitempty"`
	RateLimit        float64           `json:"rate_limit,omitempty"`
	RateBurst        int               `json:"rate_burst,omitempty"`
	DeclineCustomers []string          `json:"decline_customers,omitempty"`
	DropRate         float64           `json:"drop_rate,omitempty"`
	DropNextCharges  int               `json:"drop_next_charges,omitempty"`
	DropHang         bool              `json:"drop_hang,omitempty"`
	FailNextRefunds  int               `json:"fail_next_refunds,omitempty"`
	DeclineCodes     map[string]string `json:"decline_codes,omitempty"`
	DebitCustomers   []string          `json:"debit_customers,omitempty"`
	AuthRequired     []string          `json:"auth_required_customers,omitempty"`
	NoPaymentMethod  []string          `json:"no_payment_method_customers,omitempty"`
	CardErrorCodes   map[string]string `json:"card_error_codes,omitempty"`
	AdviceCodes      map[string]string `json:"advice_codes,omitempty"`

	MeterEventLatency     string  `json:"meter_event_latency,omitempty"`
	MeterEventRateLimit   float64 `json:"meter_event_rate_limit,omitempty"`
	MeterEventRateBurst   int     `json:"meter_event_rate_burst,omitempty"`
	DropNextMeterEvents   int     `json:"drop_next_meter_events,omitempty"`
	RejectNextMeterEvents int     `json:"reject_next_meter_events,omitempty"`
	MeterSummaryLag       string  `json:"meter_summary_lag,omitempty"`
}

func durStr(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return d.String()
}

// ToJSON converts f to its wire form.
func (f Faults) ToJSON() FaultsJSON {
	var j FaultsJSON
	j.Latency.Fixed, j.Latency.Min, j.Latency.Max = durStr(f.Latency.Fixed), durStr(f.Latency.Min), durStr(f.Latency.Max)
	j.Latency.TailProb, j.Latency.Tail = f.Latency.TailProb, durStr(f.Latency.Tail)
	if len(f.PageLatency) > 0 {
		j.PageLatency = map[string]string{}
		for p, d := range f.PageLatency {
			j.PageLatency[p] = d.String()
		}
	}
	j.ErrorRate, j.ErrorShouldRetry, j.RateLimitedRate = f.ErrorRate, f.ErrorShouldRetry, f.RateLimitedRate
	j.RateLimit, j.RateBurst, j.DeclineCustomers = f.RateLimit, f.RateBurst, f.DeclineCustomers
	j.DropRate, j.DropNextCharges, j.DropHang = f.DropRate, f.DropNextCharges, f.DropHang
	j.FailNextRefunds = f.FailNextRefunds
	j.DeclineCodes, j.DebitCustomers = f.DeclineCodes, f.DebitCustomers
	j.AuthRequired, j.NoPaymentMethod = f.AuthRequiredCustomers, f.NoPaymentMethodCustomers
	j.CardErrorCodes, j.AdviceCodes = f.CardErrorCodes, f.AdviceCodes
	j.MeterEventLatency, j.MeterEventRateLimit, j.MeterEventRateBurst = durStr(f.MeterEventLatency), f.MeterEventRateLimit, f.MeterEventRateBurst
	j.DropNextMeterEvents, j.RejectNextMeterEvents = f.DropNextMeterEvents, f.RejectNextMeterEvents
	j.MeterSummaryLag = durStr(f.MeterSummaryLag)
	return j
}

// Faults converts the wire form back, rejecting malformed durations.
func (j FaultsJSON) Faults() (Faults, error) {
	var f Faults
	var err error
	parse := func(name, s string) time.Duration {
		if s == "" || err != nil {
			return 0
		}
		d, e := time.ParseDuration(s)
		if e != nil {
			err = fmt.Errorf("%s: %w", name, e)
		}
		return d
	}
	f.Latency = Latency{
		Fixed: parse("latency.fixed", j.Latency.Fixed), Min: parse("latency.min", j.Latency.Min),
		Max: parse("latency.max", j.Latency.Max), TailProb: j.Latency.TailProb, Tail: parse("latency.tail", j.Latency.Tail),
	}
	if len(j.PageLatency) > 0 {
		f.PageLatency = map[string]time.Duration{}
		for p, s := range j.PageLatency {
			f.PageLatency[p] = parse("page_latency."+p, s)
		}
	}
	f.ErrorRate, f.ErrorShouldRetry, f.RateLimitedRate = j.ErrorRate, j.ErrorShouldRetry, j.RateLimitedRate
	f.RateLimit, f.RateBurst, f.DeclineCustomers = j.RateLimit, j.RateBurst, j.DeclineCustomers
	f.DropRate, f.DropNextCharges, f.DropHang = j.DropRate, j.DropNextCharges, j.DropHang
	f.FailNextRefunds = j.FailNextRefunds
	f.DeclineCodes, f.DebitCustomers = j.DeclineCodes, j.DebitCustomers
	f.AuthRequiredCustomers, f.NoPaymentMethodCustomers = j.AuthRequired, j.NoPaymentMethod
	f.CardErrorCodes, f.AdviceCodes = j.CardErrorCodes, j.AdviceCodes
	f.MeterEventLatency = parse("meter_event_latency", j.MeterEventLatency)
	f.MeterEventRateLimit, f.MeterEventRateBurst = j.MeterEventRateLimit, j.MeterEventRateBurst
	f.DropNextMeterEvents, f.RejectNextMeterEvents = j.DropNextMeterEvents, j.RejectNextMeterEvents
	f.MeterSummaryLag = parse("meter_summary_lag", j.MeterSummaryLag)
	return f, err
}

// serveAdmin answers the unauthenticated /_sim/ endpoints the drill and
// humans use:
//
//	GET  /_sim/faults      current faults (FaultsJSON)
//	POST /_sim/faults      replace faults (FaultsJSON body)
//	GET  /_sim/charges     every charge, oldest first
//	GET  /_sim/duplicates  Duplicates()
//	GET  /_sim/requests    Requests() and charge_creates
//	POST /_sim/advance     {"duration": "24h"} moves the clock
//	POST /_sim/refund      {"charge": "ch_…", "amount": 0} refunds by hand (RefundByHand)
//	POST /_sim/dispute     {"charge": "ch_…"} opens a dispute (Dispute)
//	POST /_sim/seed        [SeedJSON, …] stores charges directly (SeedCharge), in bulk
//	GET  /_sim/disputes    Disputes()
//	POST /_sim/settle      {"id": "pi_…|ch_…", "succeeded": false, "failure_code": "account_closed"}
//	                       settles a pending bank debit (Settle): the bank's answer, days later
//	GET  /_sim/events      every event (Events), with its signed payload and deliveries
//	POST /_sim/events/deliver {"ids": ["evt_…", …]} POSTs those events to the webhook now,
//	                       in that order (DeliverEvents): replays and out-of-order delivery
//	GET  /_sim/meters      billing meters, MeterEventCounts and MeterErrorReports
//	GET  /_sim/meter_events[?event_name=…&customer=…] recorded meter events (MeterEvents)
//
// Per-customer outcomes are faults (POST /_sim/faults): decline_customers,
// decline_codes {"cus_…": "insufficient_funds"}, card_error_codes
// {"cus_…": "processing_error"}, advice_codes {"cus_…": "do_not_try_again"}, debit_customers (end
// "processing"/"pending" until settled), auth_required_customers (402
// authentication_required off-session, requires_action on-session) and
// no_payment_method_customers (400, intent requires_payment_method).
func (s *Server) serveAdmin(w http.ResponseWriter, r *http.Request) {
	reply := func(status int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(v)
	}
	fail := func(status int, err error) { reply(status, map[string]string{"error": err.Error()}) }
	if status, v, ok := s.serveByHand(r); ok {
		reply(status, v)
		return
	}
	if status, v, ok := s.serveEvents(r); ok {
		reply(status, v)
		return
	}
	if status, v, ok := s.serveSeed(r); ok {
		reply(status, v)
		return
	}
	if status, v, ok := s.serveMeterSeed(r); ok {
		reply(status, v)
		return
	}
	if status, v, ok := s.serveMeters(r); ok {
		reply(status, v)
		return
	}
	switch r.Method + " " + r.URL.Path {
	case "GET /_sim/faults":
		reply(http.StatusOK, s.Faults().ToJSON())
	case "POST /_sim/faults":
		var j FaultsJSON
		if err := json.NewDecoder(r.Body).Decode(&j); err != nil {
			fail(http.StatusBadRequest, fmt.Errorf("decoding faults: %w", err))
			return
		}
		f, err := j.Faults()
		if err == nil {
			err = s.SetFaults(f)
		}
		if err != nil {
			fail(http.StatusBadRequest, err)
			return
		}
		reply(http.StatusOK, s.Faults().ToJSON())
	case "GET /_sim/charges":
		reply(http.StatusOK, s.Charges())
	case "GET /_sim/disputes":
		reply(http.StatusOK, s.Disputes())
	case "GET /_sim/duplicates":
		reply(http.StatusOK, s.Duplicates())
	case "GET /_sim/requests":
		reply(http.StatusOK, map[string]any{"requests": s.Requests(), "charge_creates": s.ChargeCreates()})
	case "POST /_sim/advance":
		var body struct {
			Duration string `json:"duration"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			fail(http.StatusBadRequest, fmt.Errorf("decoding advance: %w", err))
			return
		}
		d, err := time.ParseDuration(body.Duration)
		if err != nil {
			fail(http.StatusBadRequest, err)
			return
		}
		s.Advance(d)
		reply(http.StatusOK, map[string]any{"now": s.Now().UTC().Format(time.RFC3339)})
	default:
		fail(http.StatusNotFound, fmt.Errorf("no admin endpoint %s %s", r.Method, r.URL.Path))
	}
}
