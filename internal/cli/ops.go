package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pelguard/pelguard/internal/version"
)

// NewRegistry returns a registry with the Go and process collectors and
// pelguard_build_info for role ("consumer", "reaper", "auditor").
func NewRegistry(role string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		BuildInfo(role), redisPrimaryChanges)
	return reg
}

// BuildInfo is the pelguard_build_info gauge: always 1, its labels say which
// build runs in which role. Join on it (`* on(instance) group_left(version)
// pelguard_build_info`) to see a version next to any series, or count the
// versions a fleet runs during a rollout.
func BuildInfo(role string) prometheus.Collector {
	v := version.Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "pelguard_build_info",
		Help: "Always 1; the labels name the build (version, VCS revision, Go version) and the binary's role.",
		ConstLabels: prometheus.Labels{
			"version": v.Version, "revision": v.Revision, "goversion": v.GoVersion, "role": role,
		},
	})
	g.Set(1)
	return g
}

// Check is a readiness probe of one dependency.
type Check struct {
	Name string
	Fn   func(ctx context.Context) error
}

// Gate is a readiness check that fails until Open: while a binary waits for
// Redis and Postgres and starts, /healthz answers (the process is up, do
// not restart it) and /readyz says "starting: not ready".
type Gate struct{ open atomic.Bool }

// Open marks the binary started.
func (g *Gate) Open() { g.open.Store(true) }

// Check is the gate as a readiness check; list it first.
func (g *Gate) Check() Check {
	return Check{Name: "starting", Fn: func(context.Context) error {
		if !g.open.Load() {
			return errors.New("starting")
		}
		return nil
	}}
}

// Ops is the /metrics, /healthz and /readyz server.
type Ops struct {
	srv *http.Server
	ln  net.Listener
}

// ServeOps listens on addr (loopback by default, so metrics are not exposed
// by accident) and serves /metrics, /healthz (the process is up) and /readyz
// (every check passes). An empty addr disables it.
func ServeOps(addr string, reg *prometheus.Registry, checks []Check, logger *slog.Logger) (*Ops, error) {
	if addr == "" {
		return &Ops{}, nil
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		for _, c := range checks {
			if err := c.Fn(ctx); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, "%s: not ready\n", c.Name)
				writePrimary(w)
				return
			}
		}
		fmt.Fprintln(w, "ok")
		writePrimary(w)
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, Usagef("--metrics-addr %s: %v", addr, err)
	}
	o := &Ops{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, ln: ln}
	go func() {
		if err := o.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("ops server stopped", slog.Any("error", err))
		}
	}()
	logger.Info("serving /metrics, /healthz, /readyz", slog.String("addr", ln.Addr().String()))
	return o, nil
}

// Addr is the address actually listened on ("" when disabled).
func (o *Ops) Addr() string {
	if o.ln == nil {
		return ""
	}
	return o.ln.Addr().String()
}

// Close shuts the server down.
func (o *Ops) Close(ctx context.Context) error {
	if o.srv == nil {
		return nil
	}
	return o.srv.Shutdown(ctx)
}

// writePrimary adds the Redis primary this process's Sentinel client
// reached last, when it has one: after a failover, the address it follows.
func writePrimary(w http.ResponseWriter) {
	if p := lastPrimary.Load(); p != nil && *p != "" {
		fmt.Fprintf(w, "redis primary: %s\n", *p)
	}
}
