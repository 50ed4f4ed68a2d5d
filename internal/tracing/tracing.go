// Package tracing holds pelguard's OpenTelemetry plumbing: the tracer each
// role takes from its Config, and the SDK set-up the binaries share.
package tracing

import (
	"context"
	"fmt"
	"os"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Scope is the instrumentation scope of every pelguard span.
const Scope = "github.com/pelguard/pelguard"

// Tracer is tp's tracer for pelguard; nil tp is the global provider (a
// no-op unless a binary installed one with Setup).
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(Scope)
}

// Enabled reports whether the standard OTEL variables ask for an OTLP
// trace exporter: traces are off unless an endpoint is configured.
func Enabled() bool {
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup installs a global SDK tracer provider exporting over OTLP/HTTP when
// Enabled, configured only by the OTEL_* variables the exporter and the SDK
// read (endpoint, headers, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER, ...).
// serviceName is the default service.name when OTEL_SERVICE_NAME is unset.
// The returned shutdown flushes buffered spans; it is a no-op when tracing
// is off.
func Setup(ctx context.Context, serviceName string) (shutdown func(context.Context) error, err error) {
	if !Enabled() {
		return func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: building the OTLP exporter: %w", err)
	}
	// serviceName first: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// (WithFromEnv) override it.
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", serviceName)),
		resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("tracing: OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}
