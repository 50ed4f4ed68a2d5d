package reaper

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pelguard/pelguard/alerts"
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

	trimmedC    *prometheus.CounterVec
	lengthG     *prometheus.GaugeVec
	lostC       *prometheus.CounterVec
	lossesC     *prometheus.CounterVec
	deadG       *prometheus.GaugeVec
	deadOldestG *prometheus.GaugeVec
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
		trimmedC: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pelguard_reaper_stream_trimmed_total",
			Help: "Entries the reaper trimmed from a stream: read and acked by every group, and older than --stream-retention.",
		}, []string{"stream"}),
		lengthG: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pelguard_reaper_stream_length",
			Help: "XLEN of the stream after the last pass's trim.",
		}, []string{"stream"}),
		lostC: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pelguard_reaper_stream_entries_lost_total",
			Help: "Entries that left a stream before a group billed them, by stream, group and how: unread (trimmed or deleted before the group read them) or gone (pending, acked by the reaper because their bodies were gone). Losses of unknown size count in pelguard_reaper_stream_losses_total only.",
		}, []string{"stream", "group", "how"}),
		lossesC: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pelguard_reaper_stream_losses_total",
			Help: "Losses detected (each one alert stream_entries_lost), by stream, group and how (unread, gone), including those whose size Redis cannot tell.",
		}, []string{"stream", "group", "how"}),
		deadG: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pelguard_reaper_dead_letters",
			Help: "Entries in the stream's dead-letter stream (<stream>:dead), which is never trimmed.",
		}, []string{"stream"}),
		deadOldestG: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pelguard_reaper_dead_letter_oldest_seconds",
			Help: "Age of the oldest entry of the stream's dead-letter stream (0 when empty).",
		}, []string{"stream"}),
	}
	if reg != nil {
		reg.MustRegister(m.decisions, m.redrives, m.passes, m.pelSize, m.oldestIdle, m.inFlightG,
			m.trimmedC, m.lengthG, m.lostC, m.lossesC, m.deadG, m.deadOldestG)
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

func (m *Metrics) trimmed(stream string, removed, length int64) {
	if m != nil {
		m.trimmedC.WithLabelValues(stream).Add(float64(removed))
		m.lengthG.WithLabelValues(stream).Set(float64(length))
	}
}

// watching starts the loss counters of pelguard's group on stream at 0, so
// that dashboards and rules see the series before the first loss.
func (m *Metrics) watching(stream, group string) {
	if m == nil {
		return
	}
	for _, how := range []string{"unread", "gone"} {
		m.lossesC.WithLabelValues(stream, group, how)
		m.lostC.WithLabelValues(stream, group, how)
	}
}

func (m *Metrics) lost(l alerts.StreamLoss) {
	if m == nil {
		return
	}
	how := "unread"
	if l.Gone {
		how = "gone"
	}
	m.lossesC.WithLabelValues(l.Stream, l.Group, how).Inc()
	if l.Count > 0 {
		m.lostC.WithLabelValues(l.Stream, l.Group, how).Add(float64(l.Count))
	}
}

func (m *Metrics) deadLetters(stream string, n int64, oldest time.Duration) {
	if m != nil {
		m.deadG.WithLabelValues(stream).Set(float64(n))
		m.deadOldestG.WithLabelValues(stream).Set(oldest.Seconds())
	}
}

// Lost returns the entries counted lost on stream for group, how "unread"
// or "gone": for tests.
func (m *Metrics) Lost(stream, group, how string) float64 {
	if m == nil {
		return 0
	}
	var out dto.Metric
	if err := m.lostC.WithLabelValues(stream, group, how).Write(&out); err != nil {
		return 0
	}
	return out.GetCounter().GetValue()
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
