package consumer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/tracing/tracingtest"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// One event is one trace: a pelguard.event span from the read to the ack,
// with the Stripe calls and the XACK as its children, naming the event and
// its outcome and nothing secret.
func TestTraceOneEventOneTrace(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		occurredAt time.Time
		children   []string
	}{
		"first delivery":  {children: []string{"stripe.charge", "redis.xack"}},
		"past the window": {occurredAt: time.Now().Add(-48 * time.Hour), children: []string{"stripe.find_charge", "stripe.charge", "redis.xack"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, opts{})
			exp := tracetest.NewInMemoryExporter()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

			e := ev(7)
			e.OccurredAt = tc.occurredAt
			id := b.add(t, e)[0]
			cfg := b.config(t, "")
			cfg.TracerProvider = tp
			start(t, cfg)
			var root tracetest.SpanStub
			testenv.Eventually(t, 20*time.Second, func() bool {
				for _, s := range exp.GetSpans() {
					if s.Name == "pelguard.event" {
						root = s
						return true
					}
				}
				return false
			}, "the event's span ended")

			rec := b.record(t, e)
			want := map[attribute.Key]string{
				"pelguard.stream": b.stream, "pelguard.message_id": id, "pelguard.customer_id": e.CustomerID,
				"pelguard.billing_period": e.BillingPeriod, "pelguard.outcome": string(consumer.OutcomeCharged),
				"pelguard.charge_id": rec.ChargeID,
			}
			got := attrs(root.Attributes)
			for k, v := range want {
				if got[k] != v {
					t.Errorf("pelguard.event %s = %q, want %q", k, got[k], v)
				}
			}
			if root.Parent.IsValid() {
				t.Errorf("pelguard.event has a parent %s: want a trace of its own", root.Parent.SpanID())
			}

			var children []string
			for _, s := range exp.GetSpans() {
				if s.Parent.SpanID() != root.SpanContext.SpanID() {
					continue
				}
				if s.SpanContext.TraceID() != root.SpanContext.TraceID() {
					t.Errorf("%s: trace %s, want the event's %s", s.Name, s.SpanContext.TraceID(), root.SpanContext.TraceID())
				}
				children = append(children, s.Name)
			}
			if strings.Join(children, ",") != strings.Join(tc.children, ",") {
				t.Errorf("children of pelguard.event: %v, want %v", children, tc.children)
			}
			tracingtest.NoSecrets(t, exp.GetSpans(), testKey)
		})
	}
}

// A caller's span (the reaper's pelguard.redrive) is the event's parent.
func TestTraceProcessUnderCallersSpan(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	e := ev(3)
	b.add(t, e)
	cfg := b.config(t, "redriver")
	cfg.TracerProvider = tp
	p := processor(t, cfg)
	msg := b.read(t, "redriver", 1)[0]

	ctx, parent := tp.Tracer("test").Start(context.Background(), "pelguard.redrive")
	out, err := p.Process(ctx, b.stream, msg)
	parent.End()
	if err != nil || out != consumer.OutcomeCharged {
		t.Fatalf("Process: %s, %v", out, err)
	}
	var found bool
	for _, s := range exp.GetSpans() {
		if s.Name == "pelguard.event" {
			found = true
			if s.Parent.SpanID() != parent.SpanContext().SpanID() || s.SpanContext.TraceID() != parent.SpanContext().TraceID() {
				t.Errorf("pelguard.event parent %s, want the caller's %s", s.Parent.SpanID(), parent.SpanContext().SpanID())
			}
		}
	}
	if !found {
		t.Fatal("no pelguard.event span")
	}
	tracingtest.NoSecrets(t, exp.GetSpans(), testKey)
}

func attrs(kvs []attribute.KeyValue) map[attribute.Key]string {
	m := make(map[attribute.Key]string, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = kv.Value.Emit()
	}
	return m
}
