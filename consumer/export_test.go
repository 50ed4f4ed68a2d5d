package consumer

import "github.com/prometheus/client_golang/prometheus/testutil"

// WebhookResults reads pelguard_webhook_events_total{result} for tests.
func WebhookResults(m *WebhookMetrics, result string) float64 {
	return testutil.ToFloat64(m.events.WithLabelValues(result))
}

// EventsCounted reads pelguard_consumer_events_total{stream,outcome} for tests.
func EventsCounted(m *Metrics, stream string, o Outcome) float64 {
	return testutil.ToFloat64(m.events.WithLabelValues(stream, string(o)))
}
