package reaper_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/tracing/tracingtest"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/reaper"
)

// A re-drive is one trace: pelguard.redrive (the reaper's claim of a dead
// consumer's entry) is the root, the re-driven event's pelguard.event its
// child, and the event's Stripe call and XACK under that, naming the entry,
// the decision and the outcome and nothing secret.
func TestTraceRedriveOneTrace(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		row        bool // a pending row with an expired lease (killed mid-event)
		occurredAt time.Time
		children   []string
	}{
		{name: "no ledger row", children: []string{"stripe.charge", "redis.xack"}},
		// Inside the safe window the idempotency key alone makes the
		// takeover safe: no look-up.
		{name: "expired lease", row: true, children: []string{"stripe.charge", "redis.xack"}},
		// Past it, Stripe may have forgotten the key: the takeover looks
		// for the dead consumer's charge before charging.
		{name: "past the safe window", row: true, occurredAt: time.Now().Add(-48 * time.Hour),
			children: []string{"stripe.find_charge", "stripe.charge", "redis.xack"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			exp := tracetest.NewInMemoryExporter()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

			e := ev(11)
			e.OccurredAt = tc.occurredAt
			id := b.add(t, e)[0]
			b.read(t, deadName, 10)
			if tc.row {
				b.reserve(t, e, deadName, 30*time.Second)
				b.clk.Advance(time.Minute) // the dead consumer's lease runs out
			}
			b.waitIdle(t, 1, time.Millisecond)
			cfg := b.config(t, "reaper-a")
			cfg.TracerProvider = tp
			sum, err := b.newReaper(t, cfg).RunOnce(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if sum.Decisions[reaper.KindClaim] != 1 || sum.Outcomes[consumer.OutcomeCharged] != 1 {
				t.Fatalf("summary %+v, want one claim re-driven to charged", sum)
			}
			if n := b.sim.SucceededCharges(e.CustomerID, e.BillingPeriod); n != 1 {
				t.Fatalf("%d charges, want 1", n)
			}
			// RunOnce waits for its re-drives, and the syncer exports each
			// span as it ends: every span is in exp now.
			spans := exp.GetSpans()

			redrive := only(t, spans, "pelguard.redrive")
			if redrive.Parent.IsValid() {
				t.Errorf("pelguard.redrive has a parent %s: want the root of a trace", redrive.Parent.SpanID())
			}
			if redrive.Status.Code == codes.Error {
				t.Errorf("pelguard.redrive status %v for a charged re-drive", redrive.Status)
			}
			want := map[attribute.Key]string{
				"pelguard.stream": b.stream, "pelguard.message_id": id, "pelguard.deliveries": "1",
				"pelguard.decision": string(reaper.KindClaim), "pelguard.outcome": string(consumer.OutcomeCharged),
			}
			checkAttrs(t, "pelguard.redrive", redrive, want)

			event := only(t, spans, "pelguard.event")
			if event.Parent.SpanID() != redrive.SpanContext.SpanID() {
				t.Errorf("pelguard.event parent %s, want pelguard.redrive %s", event.Parent.SpanID(), redrive.SpanContext.SpanID())
			}
			rec, ok := b.get(t, e)
			if !ok {
				t.Fatal("no ledger row after the re-drive")
			}
			checkAttrs(t, "pelguard.event", event, map[attribute.Key]string{
				"pelguard.stream": b.stream, "pelguard.message_id": id, "pelguard.customer_id": e.CustomerID,
				"pelguard.billing_period": e.BillingPeriod, "pelguard.outcome": string(consumer.OutcomeCharged),
				"pelguard.charge_id": rec.ChargeID,
			})

			var children []string
			for _, s := range spans {
				if s.SpanContext.TraceID() != redrive.SpanContext.TraceID() {
					t.Errorf("%s: trace %s, want the re-drive's %s", s.Name, s.SpanContext.TraceID(), redrive.SpanContext.TraceID())
				}
				if s.Parent.SpanID() == event.SpanContext.SpanID() {
					children = append(children, s.Name)
				}
			}
			if strings.Join(children, ",") != strings.Join(tc.children, ",") {
				t.Errorf("children of pelguard.event: %v, want %v", children, tc.children)
			}
			if len(spans) != 2+len(tc.children) {
				t.Errorf("%d spans, want %d: %v", len(spans), 2+len(tc.children), names(spans))
			}
			tracingtest.NoSecrets(t, spans, testKey)
		})
	}
}

// A pass with nothing to re-drive (the entry was billed: AOF rollback)
// starts no pelguard.redrive and calls no Stripe: no trace at all.
func TestTraceNoRedriveNoSpan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	e := ev(12)
	b.charge(t, e)
	b.add(t, e)
	b.read(t, deadName, 10)
	b.waitIdle(t, 1, time.Millisecond)
	cfg := b.config(t, "reaper-a")
	cfg.TracerProvider = tp
	sum, err := b.newReaper(t, cfg).RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Decisions[reaper.KindAlreadyBilled] != 1 {
		t.Fatalf("decisions %v, want one already_billed", sum.Decisions)
	}
	if spans := exp.GetSpans(); len(spans) != 0 {
		t.Fatalf("spans %v, want none for an entry acked without a re-drive", names(spans))
	}
}

// only is the one span named name, failing t unless there is exactly one.
func only(t *testing.T, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d %s spans, want 1; spans: %v", len(found), name, names(spans))
	}
	return found[0]
}

func checkAttrs(t *testing.T, span string, s tracetest.SpanStub, want map[attribute.Key]string) {
	t.Helper()
	got := make(map[attribute.Key]string, len(s.Attributes))
	for _, kv := range s.Attributes {
		got[kv.Key] = kv.Value.String()
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s %s = %q, want %q", span, k, got[k], v)
		}
	}
}

func names(spans tracetest.SpanStubs) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name
	}
	return out
}
