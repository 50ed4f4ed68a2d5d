package tracing_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/pelguard/pelguard/internal/tracing"
)

// The OTEL variables Setup reads: every test here starts with them unset.
var otelVars = []string{
	"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
	"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
	"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
	"OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
}

// cleanEnv unsets the OTEL variables for t and restores the global provider
// after it. Tests calling it are not parallel: they set process environment
// and the global provider.
func cleanEnv(t *testing.T) {
	t.Helper()
	for _, v := range otelVars {
		t.Setenv(v, "")
	}
	before := otel.GetTracerProvider()
	t.Cleanup(func() { otel.SetTracerProvider(before) })
}

func TestSetupOnlyWhenAnEndpointIsConfigured(t *testing.T) {
	t.Run("off", func(t *testing.T) {
		cleanEnv(t)
		t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc") // a protocol alone turns nothing on
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
		cleanEnv(t)
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:1/v1/traces")
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

func TestExporterProtocol(t *testing.T) {
	for name, tc := range map[string]struct {
		protocol, tracesProtocol string
		want                     tracing.Protocol
		wantErr                  string // a substring; "" for no error
	}{
		"unset: the specification's default": {want: tracing.ProtocolHTTPProtobuf},
		"grpc":                               {protocol: "grpc", want: tracing.ProtocolGRPC},
		"http/protobuf":                      {protocol: "http/protobuf", want: tracing.ProtocolHTTPProtobuf},
		"spaces trimmed, as the exporter":    {protocol: " grpc ", want: tracing.ProtocolGRPC},
		"per-signal variable wins":           {protocol: "http/protobuf", tracesProtocol: "grpc", want: tracing.ProtocolGRPC},
		"empty per-signal variable is unset": {protocol: "grpc", tracesProtocol: " ", want: tracing.ProtocolGRPC},
		"typo":                               {protocol: "gprc", wantErr: `OTEL_EXPORTER_OTLP_PROTOCOL="gprc": want grpc or http/protobuf`},
		"typo in the per-signal variable":    {protocol: "grpc", tracesProtocol: "GRPC", wantErr: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="GRPC"`},
		"http/json: no Go exporter":          {protocol: "http/json", wantErr: "no OTLP http/json exporter"},
	} {
		t.Run(name, func(t *testing.T) {
			cleanEnv(t)
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", tc.protocol)
			t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", tc.tracesProtocol)
			got, err := tracing.ExporterProtocol()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ExporterProtocol() = %q, %v; want an error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ExporterProtocol() = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// A bad protocol stops Setup (and so the binary, cli.Tracing making it a
// usage error) before any provider is installed, with or without an
// endpoint.
func TestSetupRefusesABadProtocol(t *testing.T) {
	for _, endpoint := range []string{"", "http://127.0.0.1:1"} {
		t.Run("endpoint="+endpoint, func(t *testing.T) {
			cleanEnv(t)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpcs")
			before := otel.GetTracerProvider()
			stop, err := tracing.Setup(context.Background(), "pelguard-test")
			if err == nil || !strings.Contains(err.Error(), "OTEL_EXPORTER_OTLP_PROTOCOL") {
				t.Fatalf("Setup: %v; want an error naming OTEL_EXPORTER_OTLP_PROTOCOL", err)
			}
			if stop != nil {
				t.Error("Setup returned a shutdown with its error")
			}
			if otel.GetTracerProvider() != before {
				t.Error("Setup installed a provider despite the error")
			}
		})
	}
}

// collector is an in-process OTLP collector: the real gRPC trace service
// (or the OTLP/HTTP endpoint) that records what it is sent.
type collector struct {
	coltracepb.UnimplementedTraceServiceServer
	mu      sync.Mutex
	spans   []*tracepb.Span
	service []string // service.name of each resource received
	auth    []string // the authorization header of each export
}

func (c *collector) Export(ctx context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	c.record(req, strings.Join(md.Get("authorization"), ","))
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (c *collector) record(req *coltracepb.ExportTraceServiceRequest, auth string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.auth = append(c.auth, auth)
	for _, rs := range req.GetResourceSpans() {
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				c.service = append(c.service, kv.GetValue().GetStringValue())
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			c.spans = append(c.spans, ss.GetSpans()...)
		}
	}
}

// startGRPCCollector serves the OTLP trace service on a loopback port and
// returns its address.
func startGRPCCollector(t *testing.T) (*collector, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, c)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return c, lis.Addr().String()
}

// startHTTPCollector serves OTLP/HTTP (protobuf) on /v1/traces; any other
// request fails the test.
func startHTTPCollector(t *testing.T) (*collector, string) {
	t.Helper()
	c := &collector{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("collector: %s %s (%s), want POST /v1/traces (application/x-protobuf)", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
			http.Error(w, "not OTLP/HTTP protobuf", http.StatusBadRequest)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("collector: %v", err)
			return
		}
		req := &coltracepb.ExportTraceServiceRequest{}
		if err := proto.Unmarshal(body, req); err != nil {
			t.Errorf("collector: body is not an ExportTraceServiceRequest: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.record(req, r.Header.Get("Authorization"))
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return c, srv.URL
}

// Setup, driven only by the standard variables, exports a span to a real
// collector over the protocol they name; shutdown flushes it.
func TestSetupExportsToACollector(t *testing.T) {
	for name, tc := range map[string]struct {
		start func(*testing.T) (*collector, string)
		env   func(addr string) map[string]string
	}{
		"grpc": {start: startGRPCCollector, env: func(addr string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + addr, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
		}},
		"grpc by the per-signal variables": {start: startGRPCCollector, env: func(addr string) map[string]string {
			return map[string]string{
				"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://" + addr,
				"OTEL_EXPORTER_OTLP_PROTOCOL":        "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
			}
		}},
		"http/protobuf by default": {start: startHTTPCollector, env: func(url string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": url}
		}},
	} {
		t.Run(name, func(t *testing.T) {
			cleanEnv(t)
			c, addr := tc.start(t)
			for k, v := range tc.env(addr) {
				t.Setenv(k, v)
			}
			t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20collector-token")

			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			shutdown, err := tracing.Setup(ctx, "pelguard-test")
			if err != nil {
				t.Fatal(err)
			}
			_, span := tracing.Tracer(nil).Start(ctx, "pelguard.event")
			span.End()
			if err := shutdown(ctx); err != nil {
				t.Fatalf("shutdown (the flush to the collector): %v", err)
			}

			c.mu.Lock()
			defer c.mu.Unlock()
			if len(c.spans) != 1 || c.spans[0].GetName() != "pelguard.event" {
				names := make([]string, 0, len(c.spans))
				for _, s := range c.spans {
					names = append(names, s.GetName())
				}
				t.Fatalf("collector received spans %v, want [pelguard.event]", names)
			}
			if strings.Join(c.service, ",") != "pelguard-test" {
				t.Errorf("service.name %v, want [pelguard-test]", c.service)
			}
			if strings.Join(c.auth, ",") != "Bearer collector-token" {
				t.Errorf("authorization header %q, want OTEL_EXPORTER_OTLP_HEADERS' %q", c.auth, "Bearer collector-token")
			}
		})
	}
}
