package alerts

import (
	"context"
	"log/slog"
	"strings"
)

// Log is the notifier used when Slack is not configured: every alert becomes
// one warning in the log, redacted like a Slack message.
type Log struct {
	logger *slog.Logger
	m      *metrics
}

// NewLog returns a log-only notifier. Notify writes synchronously: a log
// handler is as fast as the billing code's own logging.
func NewLog(logger *slog.Logger) *Log {
	m, _ := newMetrics(nil) // without a registerer it cannot fail
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return newLog(logger, m)
}

func newLog(logger *slog.Logger, m *metrics) *Log {
	return &Log{logger: logger, m: m}
}

// Notify logs a.
func (l *Log) Notify(a Alert) {
	attrs := []any{
		slog.String("kind", string(a.Kind)),
		slog.String("title", Redact(a.Title)),
		slog.String("text", Redact(a.Text)),
	}
	if len(a.Fields) > 0 {
		fields := make([]string, 0, len(a.Fields))
		for _, f := range a.Fields {
			fields = append(fields, f.Label+"="+f.Value)
		}
		attrs = append(attrs, slog.String("fields", Redact(strings.Join(fields, " "))))
	}
	if len(a.Items) > 0 {
		items := make([]string, 0, len(a.Items))
		for _, it := range a.Items {
			items = append(items, it.Text)
		}
		attrs = append(attrs, slog.Int("items", len(a.Items)), slog.String("item_lines", Redact(strings.Join(items, "\n"))))
	}
	if a.Command != "" {
		attrs = append(attrs, slog.String("command", Redact(a.Command)))
	}
	l.logger.Warn("alert", attrs...)
	l.m.incSent(a.Kind)
}

// Close does nothing: nothing is queued.
func (l *Log) Close(context.Context) error { return nil }

// Stats returns the counters; Sent counts logged alerts.
func (l *Log) Stats() Stats { return l.m.stats() }
