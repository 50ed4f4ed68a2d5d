package consumer

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the consumer's Prometheus series. A nil *Metrics records nothing.
type Metrics struct {
	events      *prometheus.CounterVec
	stripe      *prometheus.HistogramVec
	inFlight    *prometheus.GaugeVec
	heartbeats  *prometheus.CounterVec
	deadLetters *prometheus.CounterVec
	parkedRows  prometheus.Counter
	backlog     *meterBacklogMetrics
}

// NewMetrics registers the consumer's series on reg. Every series but the
// Stripe latency histogram carries a stream label: one process may consume
// several streams (shards), and "which shard dead-letters" is a per-stream
// question.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pelguard_consumer_events_total",
			Help: "Events handled, by outcome (charged, processing, action_required, already_billed, declined, failed, dead_letter, spend_cap, busy, retry_later, lease_lost; meter events: delivered, parked and the same already_billed, failed, dead_letter, spend_cap, busy, retry_later); ledger-driven retries under stream=\"(ledger)\".",
		}, []string{"stream", "outcome"}),
		stripe: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pelguard_consumer_stripe_seconds",
			Help:    "Latency of Stripe charge and lookup calls, by result class.",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"result"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pelguard_consumer_in_flight",
			Help: "Stream entries held (read and not yet acked or left).",
		}, []string{"stream"}),
		heartbeats: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pelguard_consumer_heartbeats_total",
			Help: "PEL entry and lease renewals, by result (renewed, lost, error).",
		}, []string{"stream", "result"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pelguard_consumer_dead_letters_total",
			Help: "Entries sent to the dead-letter stream, by reason.",
		}, []string{"stream", "reason"}),
		parkedRows: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pelguard_consumer_parked_total",
			Help: "Ledger-driven rows parked after their takeover budget ran out (a person must look; consumer retry takes them up).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.events, m.stripe, m.inFlight, m.heartbeats, m.deadLetters, m.parkedRows)
	}
	m.backlog = newMeterBacklogMetrics(reg)
	return m
}

// startStream starts a stream's known series at zero, so a dashboard's
// rate() and an alert on "failed > 0" see them before the first such event.
func (m *Metrics) startStream(stream string) {
	if m == nil {
		return
	}
	for _, o := range []Outcome{OutcomeCharged, OutcomeAlreadyBilled, OutcomeDeclined, OutcomeFailed, OutcomeDeadLetter,
		OutcomeSpendCap, OutcomeBusy, OutcomeRetryLater, OutcomeLeaseLost, OutcomeProcessing, OutcomeActionRequired} {
		m.events.WithLabelValues(stream, string(o))
	}
	for _, r := range []string{"renewed", "lost", "error"} {
		m.heartbeats.WithLabelValues(stream, r)
	}
	m.inFlight.WithLabelValues(stream)
}

// startMeterStream is startStream for a meter-event stream's outcomes.
func (m *Metrics) startMeterStream(stream string) {
	if m == nil {
		return
	}
	for _, o := range []Outcome{OutcomeDelivered, OutcomeAlreadyBilled, OutcomeFailed, OutcomeDeadLetter,
		OutcomeParked, OutcomeSpendCap, OutcomeBusy, OutcomeRetryLater} {
		m.events.WithLabelValues(stream, string(o))
	}
	m.inFlight.WithLabelValues(stream)
}

func (m *Metrics) event(stream string, outcome Outcome) { m.eventsN(stream, outcome, 1) }

// eventsN counts n events of one outcome.
func (m *Metrics) eventsN(stream string, outcome Outcome, n int) {
	if m != nil {
		m.events.WithLabelValues(stream, string(outcome)).Add(float64(n))
	}
}

func (m *Metrics) stripeCall(result string, seconds float64) {
	if m != nil {
		m.stripe.WithLabelValues(result).Observe(seconds)
	}
}

func (m *Metrics) held(stream string, delta float64) {
	if m != nil {
		m.inFlight.WithLabelValues(stream).Add(delta)
	}
}

func (m *Metrics) heartbeat(stream, result string, n int) {
	if m != nil && n > 0 {
		m.heartbeats.WithLabelValues(stream, result).Add(float64(n))
	}
}

func (m *Metrics) deadLetter(stream, reason string) {
	if m != nil {
		m.deadLetters.WithLabelValues(stream, reason).Inc()
	}
}

func (m *Metrics) parked() {
	if m != nil {
		m.parkedRows.Inc()
	}
}
