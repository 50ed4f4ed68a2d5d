package audit

import (
	"errors"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pelguard/pelguard/alerts"
)

// usageMetrics are the reconciliation's series (pelguard_auditor_usage_*), part of
// Metrics.
type usageMetrics struct {
	runs        *prometheus.CounterVec
	windows     prometheus.Counter
	requests    prometheus.Counter
	open        *prometheus.GaugeVec
	drift       *prometheus.GaugeVec
	corrections *prometheus.CounterVec
}

func newUsageMetrics() usageMetrics {
	m := usageMetrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pelguard_auditor_usage_runs_total",
			Help: "Usage reconciliation runs, by result (clean, findings, locked, empty, error).",
		}, []string{"result"}),
		windows: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pelguard_auditor_usage_windows_compared_total",
			Help: "Meter windows (customer, meter, hour or day) whose Stripe summary was compared with the ledger.",
		}),
		requests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pelguard_auditor_usage_summary_requests_total",
			Help: "Meter event summary requests the usage reconciliation made.",
		}),
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pelguard_auditor_usage_open_findings",
			Help: "Open usage findings after the last reconciliation run, by kind (usage_over, usage_under).",
		}, []string{"kind"}),
		drift: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pelguard_auditor_usage_drift_units",
			Help: "Units (events, for count meters) by which Stripe's meter totals differ from the ledger over the open usage findings, by kind.",
		}, []string{"kind"}),
		corrections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pelguard_auditor_usage_corrections_total",
			Help: "Usage corrections handled by the reconciliation, by kind (negative_event, resend) and status (sent, recorded, failed, unknown, skipped).",
		}, []string{"kind", "status"}),
	}
	for _, r := range []string{ResultClean, ResultFindings, ResultLocked, ResultEmpty, ResultError} {
		m.runs.WithLabelValues(r)
	}
	for _, k := range []UsageKind{UsageOver, UsageUnder} {
		m.open.WithLabelValues(string(k))
		m.drift.WithLabelValues(string(k))
	}
	for _, k := range []string{CorrectionNegativeEvent, CorrectionResend} {
		for _, s := range []string{"sent", "recorded", "failed", "unknown", "skipped"} {
			m.corrections.WithLabelValues(k, s)
		}
	}
	return m
}

func (m usageMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.runs, m.windows, m.requests, m.open, m.drift, m.corrections}
}

// ObserveUsage records one reconciliation run's outcome.
func (m *Metrics) ObserveUsage(rep UsageReport, err error) {
	if m == nil {
		return
	}
	u := m.usage
	switch {
	case errors.Is(err, ErrLocked):
		u.runs.WithLabelValues(ResultLocked).Inc()
		return
	case errors.Is(err, ErrUsageSpan):
		u.runs.WithLabelValues(ResultEmpty).Inc()
		return
	}
	u.windows.Add(float64(rep.WindowsCompared))
	u.requests.Add(float64(rep.Requests))
	for _, c := range rep.Corrections {
		status := c.Status
		if c.Skipped != "" {
			status = "skipped"
		}
		u.corrections.WithLabelValues(c.Kind, status).Inc()
	}
	if err != nil {
		u.runs.WithLabelValues(ResultError).Inc()
		return
	}
	for _, k := range []UsageKind{UsageOver, UsageUnder} {
		u.open.WithLabelValues(string(k)).Set(float64(rep.OpenByKind[k]))
		u.drift.WithLabelValues(string(k)).Set(float64(rep.DriftUnits[k]))
	}
	if rep.OpenFindings > 0 {
		u.runs.WithLabelValues(ResultFindings).Inc()
	} else {
		u.runs.WithLabelValues(ResultClean).Inc()
	}
}

// alertUsage sends one message per run with the findings it opened and the
// corrections it made or could not make.
func (a *Auditor) alertUsage(rep UsageReport) {
	if a.cfg.Notifier == nil {
		return
	}
	byFinding := map[int64]UsageCorrection{}
	corrected := 0
	for _, c := range rep.Corrections {
		byFinding[c.FindingID] = c
		if c.Status == "sent" {
			corrected++
		}
	}
	var items []alerts.UsageFindingInfo
	manual := 0
	for _, f := range rep.Findings {
		c, hasC := byFinding[f.ID]
		if !f.New && !(hasC && c.Skipped == "") {
			continue
		}
		info := alerts.UsageFindingInfo{ID: f.ID, Kind: string(f.Kind), EventName: f.EventName, Customer: f.StripeCustomerID,
			WindowStart: f.WindowStart, WindowEnd: f.WindowEnd, LedgerValue: f.LedgerValue, StripeValue: f.StripeValue}
		switch {
		case hasC && c.Status == "sent":
			info.Correction = describeCorrection(c)
		case f.ManualAction != "" && !(hasC && c.Skipped != ""):
			info.Correction, info.ManualAction = f.ManualAction, true
			manual++
		case hasC && c.Skipped != "":
			info.Correction = "not corrected yet: " + c.Skipped
		}
		if f.Unknown != "" {
			info.Correction = strings.TrimSpace(info.Correction + " " + f.Unknown)
		}
		items = append(items, info)
	}
	if len(items) == 0 {
		return
	}
	a.cfg.Notifier.Notify(alerts.UsageDrift(rep.RunID, items, corrected, manual))
}
