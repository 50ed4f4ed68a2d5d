package alerts

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons an alert is dropped (the "reason" label of pelguard_alerts_dropped_total).
const (
	DropQueueFull = "queue_full"
	DropDeduped   = "deduped"
	DropClosed    = "closed"   // Notify after Close
	DropShutdown  = "shutdown" // still queued when Close's ctx ended
)

// Stats are a notifier's counters since it was built.
type Stats struct {
	Sent    int64 // messages delivered (thread replies not included)
	Failed  int64 // messages given up on after their attempts, or refused by Slack
	Dropped int64 // alerts never attempted: queue full, closed or shut down
	Deduped int64 // alerts suppressed by fingerprint
	Retries int64 // attempts after the first
}

type metrics struct {
	sent, failed, dropped *prometheus.CounterVec

	nSent, nFailed, nDropped, nDeduped, nRetries atomic.Int64
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pelguard_alerts_sent_total", Help: "Alerts delivered, by kind.",
		}, []string{"kind"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pelguard_alerts_failed_total", Help: "Alerts given up on after retries, by kind.",
		}, []string{"kind"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pelguard_alerts_dropped_total", Help: "Alerts not attempted, by reason (queue_full, deduped, closed, shutdown).",
		}, []string{"reason"}),
	}
	// Every kind and reason starts at zero, so dashboards and alert rules see
	// the series before the first failure.
	for _, k := range []Kind{KindAuditSummary, KindAuditFinding, KindDeadLetters, KindSpendCap, KindReaperAnomaly,
		KindChargeFailed, KindStripeLookupFailed, KindPermissionDenied, KindMeterMissing} {
		m.sent.WithLabelValues(string(k))
		m.failed.WithLabelValues(string(k))
	}
	for _, r := range []string{DropQueueFull, DropDeduped, DropClosed, DropShutdown} {
		m.dropped.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []**prometheus.CounterVec{&m.sent, &m.failed, &m.dropped} {
		if err := reg.Register(*c); err != nil {
			// A second notifier in the same process shares the counters.
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, fmt.Errorf("alerts: registering metrics: %w", err)
			}
			existing, ok := are.ExistingCollector.(*prometheus.CounterVec)
			if !ok {
				return nil, fmt.Errorf("alerts: registering metrics: %w", err)
			}
			*c = existing
		}
	}
	return m, nil
}

func (m *metrics) incSent(k Kind) {
	m.nSent.Add(1)
	m.sent.WithLabelValues(string(k)).Inc()
}

func (m *metrics) incFailed(k Kind) {
	m.nFailed.Add(1)
	m.failed.WithLabelValues(string(k)).Inc()
}

func (m *metrics) incDropped(reason string) {
	if reason == DropDeduped {
		m.nDeduped.Add(1)
	} else {
		m.nDropped.Add(1)
	}
	m.dropped.WithLabelValues(reason).Inc()
}

func (m *metrics) stats() Stats {
	return Stats{
		Sent: m.nSent.Load(), Failed: m.nFailed.Load(), Dropped: m.nDropped.Load(),
		Deduped: m.nDeduped.Load(), Retries: m.nRetries.Load(),
	}
}
