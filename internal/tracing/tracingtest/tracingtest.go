// Package tracingtest holds the checks the consumer's and the reaper's
// trace tests share.
package tracingtest

import (
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pelguard/pelguard/internal/redact"
)

// NoSecrets fails on any attribute (of a span, a span event or the
// resource) or status that internal/redact would mask, or that looks like
// an e-mail address. known is a secret the test used (its Stripe key): if
// redact does not mask it, the check would prove nothing, so it fails.
func NoSecrets(t testing.TB, spans tracetest.SpanStubs, known string) {
	t.Helper()
	if redact.String("key "+known) == "key "+known {
		t.Fatal("internal/redact does not recognise the test's secret: the check below would prove nothing")
	}
	check := func(span string, kvs []attribute.KeyValue) {
		for _, kv := range kvs {
			v := kv.Value.String()
			if redact.String(v) != v || strings.Contains(v, "@") {
				t.Errorf("%s: attribute %s = %q carries a secret, card data or an e-mail", span, kv.Key, v)
			}
		}
	}
	for _, s := range spans {
		check(s.Name, s.Attributes)
		for _, ev := range s.Events {
			check(s.Name+"/"+ev.Name, ev.Attributes)
		}
		check(s.Name+" (resource)", s.Resource.Attributes())
		if s.Status.Description != redact.String(s.Status.Description) {
			t.Errorf("%s: status %q carries a secret", s.Name, s.Status.Description)
		}
	}
}
