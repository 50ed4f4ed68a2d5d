package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewRegistry returns a registry with the Go and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Check is a readiness probe of one dependency.
type Check struct {
	Name string
	Fn   func(ctx context.Context) error
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
				return
			}
		}
		fmt.Fprintln(w, "ok")
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
