package audit

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Run results, the "result" label of pelguard_auditor_runs_total.
const (
	ResultClean    = "clean"    // the run finished with no open findings
	ResultFindings = "findings" // the run finished with open findings
	ResultLocked   = "locked"   // skipped: another run held the lock
	ResultEmpty    = "empty"    // skipped: nothing new to audit yet
	ResultError    = "error"    // the run failed
)

// Metrics are the auditor's Prometheus series (pelguard_auditor_*), fed from
// each run's Report through Observe (the Scheduler's onReport). A nil
// *Metrics records nothing.
type Metrics struct {
	runs          *prometheus.CounterVec
	findings      *prometheus.CounterVec
	open          *prometheus.GaugeVec
	charges       prometheus.Counter
	duration      prometheus.Histogram
	refunds       *prometheus.CounterVec
	refundedCents prometheus.Counter
	lastSuccess   prometheus.Gauge
	usage         usageMetrics
}

// NewMetrics registers the auditor's series on reg. Every label value is
// created at zero, so dashboards and rate() see the series before the first
// finding.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pelguard_auditor_runs_total",
			Help: "Audit runs, by result (clean, findings, locked, empty, error).",
		}, []string{"result"}),
		findings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pelguard_auditor_findings_total",
			Help: "New findings recorded, by kind.",
		}, []string{"kind"}),
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pelguard_auditor_open_findings",
			Help: "Open findings the last finished run detected, by kind.",
		}, []string{"kind"}),
		charges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pelguard_auditor_charges_scanned_total",
			Help: "Stripe charges listed and compared with the ledger.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "pelguard_auditor_run_seconds",
			Help:    "Duration of audit runs that started (locked and empty skips excluded).",
			Buckets: []float64{.1, .5, 1, 5, 15, 30, 60, 120, 300, 600, 1800},
		}),
		refunds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pelguard_auditor_refunds_total",
			Help: "Duplicate charges handled by --auto-refund, by result (refunded, skipped).",
		}, []string{"result"}),
		refundedCents: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pelguard_auditor_refunded_cents_total",
			Help: "Minor units refunded by --auto-refund (all currencies summed).",
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pelguard_auditor_last_success_timestamp_seconds",
			Help: "Unix time of the last audit run that finished without error (0: none yet).",
		}),
		usage: newUsageMetrics(),
	}
	for _, r := range []string{ResultClean, ResultFindings, ResultLocked, ResultEmpty, ResultError} {
		m.runs.WithLabelValues(r)
	}
	for _, k := range Kinds {
		m.findings.WithLabelValues(string(k))
		m.open.WithLabelValues(string(k))
	}
	m.refunds.WithLabelValues("refunded")
	m.refunds.WithLabelValues("skipped")
	if reg != nil {
		reg.MustRegister(m.runs, m.findings, m.open, m.charges, m.duration, m.refunds, m.refundedCents, m.lastSuccess)
		reg.MustRegister(m.usage.collectors()...)
	}
	return m
}

// Observe records one run's outcome; it has the Scheduler's onReport
// signature.
func (m *Metrics) Observe(rep Report, err error) {
	if m == nil {
		return
	}
	switch {
	case errors.Is(err, ErrLocked):
		m.runs.WithLabelValues(ResultLocked).Inc()
		return
	case errors.Is(err, ErrEmptyWindow):
		m.runs.WithLabelValues(ResultEmpty).Inc()
		return
	}
	if rep.RunID != 0 {
		m.duration.Observe(rep.Duration.Seconds())
		m.charges.Add(float64(rep.ChargesScanned))
	}
	for _, f := range rep.Findings {
		if f.New {
			m.findings.WithLabelValues(string(f.Kind)).Inc()
		}
	}
	if rep.Refund != nil {
		m.refunds.WithLabelValues("refunded").Add(float64(len(rep.Refund.Refunded)))
		m.refunds.WithLabelValues("skipped").Add(float64(len(rep.Refund.Skipped)))
		m.refundedCents.Add(float64(rep.Refund.RefundedCents))
	}
	if err != nil {
		m.runs.WithLabelValues(ResultError).Inc()
		return
	}
	open := map[Kind]float64{}
	for _, f := range rep.Findings {
		if f.State == StateOpen {
			open[f.Kind]++
		}
	}
	for _, k := range Kinds {
		m.open.WithLabelValues(string(k)).Set(open[k])
	}
	if rep.OpenFindings > 0 {
		m.runs.WithLabelValues(ResultFindings).Inc()
	} else {
		m.runs.WithLabelValues(ResultClean).Inc()
	}
	m.lastSuccess.SetToCurrentTime()
}
