package tracing_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/pelguard/pelguard/internal/tracing"
)

// Not parallel: the subtests set process environment and the global provider.
func TestSetupOnlyWhenAnEndpointIsConfigured(t *testing.T) {
	t.Run("off", func(t *testing.T) {
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
		before := otel.GetTracerProvider()
		stop, err := tracing.Setup(context.Background(), "pelguard-test")
		if err != nil {
			t.Fatal(err)
		}
		if otel.GetTracerProvider() != before {
			t.Fatal("Setup installed a provider with no endpoint configured")
		}
		if err := stop(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("on", func(t *testing.T) {
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:1/v1/traces")
		before := otel.GetTracerProvider()
		t.Cleanup(func() { otel.SetTracerProvider(before) })
		stop, err := tracing.Setup(context.Background(), "pelguard-test")
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := otel.GetTracerProvider().(*sdktrace.TracerProvider); !ok {
			t.Fatalf("global provider is %T, want the SDK's", otel.GetTracerProvider())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = stop(ctx) // nothing was recorded, so nothing must reach the (absent) collector
	})
}
