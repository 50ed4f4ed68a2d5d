// Package tracing holds pelguard's OpenTelemetry plumbing: the tracer each
// role takes from its Config, and the SDK set-up the binaries share.
package tracing

import (
	"context"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
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
	return env("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Protocol is an OTLP transport, as OTEL_EXPORTER_OTLP_PROTOCOL names it.
type Protocol string

// The protocols Setup exports with. The specification's third, http/json,
// has no exporter in OpenTelemetry-Go.
const (
	ProtocolHTTPProtobuf Protocol = "http/protobuf" // the specification's default
	ProtocolGRPC         Protocol = "grpc"
)

// ExporterProtocol is the OTLP transport the standard variables ask for:
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL,
// else http/protobuf (an empty variable counts as unset, as the
// specification says). Any other value is an error naming the variable,
// checked whether or not an endpoint is set, so a typo is caught the day it
// is made and not the day traces are turned on.
func ExporterProtocol() (Protocol, error) {
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		v := env(name)
		switch Protocol(v) {
		case "":
			continue
		case ProtocolHTTPProtobuf, ProtocolGRPC:
			return Protocol(v), nil
		case "http/json":
			return "", fmt.Errorf("tracing: %s=%s: OpenTelemetry-Go has no OTLP http/json exporter; want grpc or http/protobuf", name, v)
		default:
			return "", fmt.Errorf("tracing: %s=%q: want grpc or http/protobuf (or unset: http/protobuf)", name, v)
		}
	}
	return ProtocolHTTPProtobuf, nil
}

// Setup installs a global SDK tracer provider exporting over OTLP when
// Enabled, over HTTP (protobuf) or gRPC as ExporterProtocol says, configured
// only by the OTEL_* variables the exporters and the SDK read (endpoint,
// headers, TLS, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER, ...). serviceName
// is the default service.name when OTEL_SERVICE_NAME is unset. The returned
// shutdown flushes buffered spans; it is a no-op when tracing is off. A
// protocol it cannot export with is an error even when tracing is off.
func Setup(ctx context.Context, serviceName string) (shutdown func(context.Context) error, err error) {
	proto, err := ExporterProtocol()
	if err != nil {
		return nil, err
	}
	if !Enabled() {
		return func(context.Context) error { return nil }, nil
	}
	var exp *otlptrace.Exporter
	switch proto {
	case ProtocolGRPC:
		// Dials lazily: a collector that is down at start costs spans, not
		// the start.
		exp, err = otlptracegrpc.New(ctx)
	default:
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: building the OTLP %s exporter: %w", proto, err)
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

// env is the variable trimmed, as the exporters read it.
func env(name string) string { return strings.TrimSpace(os.Getenv(name)) }
