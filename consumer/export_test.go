package consumer

import "github.com/prometheus/client_golang/prometheus/testutil"

// WebhookResults reads pelguard_webhook_events_total{result} for tests.
func WebhookResults(m *WebhookMetrics, result string) float64 {
	return testutil.ToFloat64(m.events.WithLabelValues(result))
}
