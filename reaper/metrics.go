package reaper

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pelguard/pelguard/consumer"
)

// Metrics are the reaper's Prometheus series. A nil *Metrics records nothing.
type Metrics struct {
	decisions  *prometheus.CounterVec
	redrives   *prometheus.CounterVec
	passes     prometheus.Histogram
	pelSize    *prometheus.GaugeVec
	oldestIdle *prometheus.GaugeVec
	inFlightG  prometheus.Gauge
}

// NewMetrics registers the reaper's series on reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pelguard_reaper_decisions_total",
			Help: "Decisions per pending entry, by stream and kind (gone, invalid, already_billed, conflict, lease_live, max_deliveries, claim, redriven, claim_lost, in_flight, unregistered_consumer, error, remove_consumer).",
		}, []string{"stream", "kind"}),
		redrives: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pelguard_reaper_redrives_total",
			Help: "Re-drives of claimed entries, by the consumer outcome they ended with.",
		}, []string{"outcome"}),
		passes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "pelguard_reaper_pass_seconds",
			Help:    "Duration of a reaper pass over every stream (re-drives excluded).",
			Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 12),
		}),
		pelSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pelguard_reaper_pel_size",
			Help: "Pending entries of the group, per stream, after the last pass.",
		}, []string{"stream"}),
		oldestIdle: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pelguard_reaper_oldest_pending_idle_seconds",
			Help: "Idle time of the longest-idle pending entry seen by the last pass, per stream.",
		}, []string{"stream"}),
		inFlightG: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pelguard_reaper_redrives_in_flight",
			Help: "Re-drives running now.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.decisions, m.redrives, m.passes, m.pelSize, m.oldestIdle, m.inFlightG)
	}
	return m
}

func (m *Metrics) decision(stream string, k Kind) {
	if m != nil {
		m.decisions.WithLabelValues(stream, string(k)).Inc()
	}
}

func (m *Metrics) redrive(o consumer.Outcome) {
	if m != nil {
		m.redrives.WithLabelValues(string(o)).Inc()
	}
}

func (m *Metrics) passDone(d time.Duration) {
	if m != nil {
		m.passes.Observe(d.Seconds())
	}
}

func (m *Metrics) pel(stream string, size int64, oldest time.Duration) {
	if m != nil {
		m.pelSize.WithLabelValues(stream).Set(float64(size))
		m.oldestIdle.WithLabelValues(stream).Set(oldest.Seconds())
	}
}

func (m *Metrics) inFlight(delta float64) {
	if m != nil {
		m.inFlightG.Add(delta)
	}
}

// Decisions returns how many decisions of kind were counted for stream: for
// tests and the drill's summary.
func (m *Metrics) Decisions(stream string, k Kind) float64 {
	if m == nil {
		return 0
	}
	var out dto.Metric
	if err := m.decisions.WithLabelValues(stream, string(k)).Write(&out); err != nil {
		return 0
	}
	return out.GetCounter().GetValue()
}
