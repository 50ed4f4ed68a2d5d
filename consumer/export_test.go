package consumer

import (
	"context"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// WebhookResults reads pelguard_webhook_events_total{result} for tests.
func WebhookResults(m *WebhookMetrics, result string) float64 {
	return testutil.ToFloat64(m.events.WithLabelValues(result))
}

// EventsCounted reads pelguard_consumer_events_total{stream,outcome} for tests.
func EventsCounted(m *Metrics, stream string, o Outcome) float64 {
	return testutil.ToFloat64(m.events.WithLabelValues(stream, string(o)))
}

// PublishBacklog is the backlog loop's work, once, for tests.
func PublishBacklog(c *MeterConsumer, ctx context.Context) error { return c.publishBacklog(ctx) }

// MeterBacklogGauges reads the unsent backlog gauges of a stream's meter
// (events queued, the busiest customer's, the oldest's age in seconds).
func MeterBacklogGauges(m *Metrics, stream, eventName string) (queued, busiest, oldest float64) {
	g := m.backlog
	return testutil.ToFloat64(g.queued.WithLabelValues(stream, eventName)), testutil.ToFloat64(g.busiest.WithLabelValues(stream, eventName)),
		testutil.ToFloat64(g.oldest.WithLabelValues(stream, eventName))
}
