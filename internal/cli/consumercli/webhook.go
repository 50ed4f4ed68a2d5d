package consumercli

import (
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/cli"
)

const webhookDescription = `Receives Stripe's webhook events and settles money in motion at once: a bank debit recorded
processing becomes charged when Stripe says it succeeded, or declined (retried under the next
attempt's key when its failure code allows) when it failed. Optional: the consumers' polling
(--follow-up-every) settles the same rows without it, only later.

It serves POST ` + consumer.WebhookPath + ` and GET /healthz on --listen, and /metrics on --metrics-addr.
Every request's Stripe-Signature is verified (stripe-go's webhook package, --tolerance) with the
endpoint's signing secret, read only from PELGUARD_STRIPE_WEBHOOK_SECRET (whsec_…) and never
logged; a bad signature gets 400 and changes nothing. 200 only after the ledger write committed;
an event id seen before is answered 200 at once. It needs Postgres, not Redis nor a Stripe key.
Subscribe the endpoint to charge.succeeded, charge.failed, payment_intent.succeeded and
payment_intent.payment_failed (charge.pending, payment_intent.processing and
payment_intent.requires_action are accepted and ignored).

Environment: DATABASE_URL, PELGUARD_STRIPE_WEBHOOK_SECRET, PELGUARD_WEBHOOK_LISTEN, SLACK_*.
Exit status: 0 stopped cleanly, 2 bad flags or configuration, 3 Postgres unreachable after
--wait-for-deps.`

// WebhookOptions are the flags of `consumer webhook`.
type WebhookOptions struct {
	DatabaseURL string
	Schema      string
	Listen      string
	MetricsAddr string
	Tolerance   time.Duration
	WaitForDeps time.Duration
	MaxDBConns  int
	Retries     cli.Retries
	Log         cli.Logging
	Slack       cli.Slack

	secret string // from the environment only
}

func (o *WebhookOptions) register(fs *flag.FlagSet) {
	cli.RegisterDatabase(fs, &o.DatabaseURL)
	cli.RegisterSchema(fs, &o.Schema)
	fs.StringVar(&o.Listen, "listen", cli.Env("PELGUARD_WEBHOOK_LISTEN", ":8089"), "address Stripe's POSTs reach (behind a TLS-terminating ingress) [PELGUARD_WEBHOOK_LISTEN]")
	cli.RegisterMetricsAddr(fs, &o.MetricsAddr, cli.ConsumerMetrics.MetricsEnv, cli.ConsumerMetrics.MetricsDefault)
	fs.DurationVar(&o.Tolerance, "tolerance", consumer.DefaultWebhookTolerance, "refuse events whose signature is older than this (replay protection)")
	cli.RegisterWait(fs, &o.WaitForDeps)
	cli.RegisterMaxDBConns(fs, &o.MaxDBConns)
	o.Retries.Register(fs)
	o.Log.Register(fs)
	o.Slack.Register(fs)
}

// Validate checks the flags and the secret's presence (not its value).
func (o *WebhookOptions) Validate() error {
	if err := cli.CheckSchemaFlag(o.DatabaseURL, o.Schema); err != nil {
		return err
	}
	o.secret = os.Getenv("PELGUARD_STRIPE_WEBHOOK_SECRET")
	if o.secret == "" {
		return cli.Usagef("PELGUARD_STRIPE_WEBHOOK_SECRET is not set: copy the endpoint's signing secret (whsec_…) from the Stripe Dashboard (Developers → Webhooks → the endpoint)")
	}
	if len(o.secret) < 7 || o.secret[:6] != "whsec_" {
		return cli.Usagef("PELGUARD_STRIPE_WEBHOOK_SECRET does not look like a signing secret (want whsec_…; an API key is not one)")
	}
	if _, _, err := net.SplitHostPort(o.Listen); err != nil {
		return cli.Usagef("--listen %q: want host:port, e.g. :8089", o.Listen)
	}
	if o.Tolerance < 30*time.Second || o.Tolerance > time.Hour {
		return cli.Usagef("--tolerance %s must be between 30s and 1h (Stripe signs each delivery when it sends it)", o.Tolerance)
	}
	if err := o.Retries.Validate(); err != nil {
		return err
	}
	if err := o.Log.Validate(); err != nil {
		return err
	}
	return cli.ValidateWait(o.WaitForDeps)
}

func webhookCmd(ctx context.Context, args []string, _, stderr io.Writer) int {
	name := prog + " webhook"
	fs := cli.NewFlagSet(name, name+" [--listen :8089] [flags]", webhookDescription, stderr)
	var o WebhookOptions
	o.register(fs)
	if err := cli.ParseFlags(fs, args); err != nil {
		return cli.Fail(stderr, name, err)
	}
	if err := o.Validate(); err != nil {
		return cli.Fail(stderr, name, err)
	}
	return o.run(ctx, stderr)
}

func (o *WebhookOptions) run(ctx context.Context, stderr io.Writer) int {
	name := prog + " webhook"
	logger, err := o.Log.Logger(stderr)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	cli.RouteLibraryLogs(logger)
	reg := cli.NewRegistry("webhook")
	notifier, err := o.Slack.Notifier(logger, reg)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	defer closeNotifier(notifier)
	conns, err := cli.MaxDBConns(o.MaxDBConns, 8)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	mon, err := cli.NewRollback("webhook", "", o.Schema, nil, notifier, logger, reg)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	pool, pgDep, err := cli.NewDB(o.DatabaseURL, conns, mon.AfterConnect)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	defer pool.Close()
	defer mon.Close() // before the pool closes
	h, err := consumer.WebhookHandler(consumer.WebhookConfig{DB: pool, Schema: o.Schema, Secret: o.secret, Tolerance: o.Tolerance,
		Retry: o.Retries.Policy(), Notifier: notifier, Logger: logger, Metrics: consumer.NewWebhookMetrics(reg), Witness: mon})
	if err != nil {
		return cli.Fail(stderr, name, cli.Usagef("%v", err))
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return cli.Fail(stderr, name, cli.Usagef("--listen %s: %v", o.Listen, err))
	}
	ops, started, code, ok := cli.Startup{Prog: prog, MetricsAddr: o.MetricsAddr, Registry: reg, Pool: pool,
		Deps: []cli.Dep{pgDep}, Wait: o.WaitForDeps, Schema: o.Schema,
		ClockLimit: 5 * time.Second, ClockWhat: "5s", Logger: logger, Rollback: mon}.Run(ctx, stderr)
	if !ok {
		_ = ln.Close()
		return code
	}
	defer func() { _ = ops.Close(context.Background()) }()
	mux := http.NewServeMux()
	mux.Handle(consumer.WebhookPath, h)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	started.Open()
	logger.Info("receiving Stripe webhooks", slog.String("addr", ln.Addr().String()), slog.String("path", consumer.WebhookPath))
	select {
	case <-ctx.Done():
	case err := <-errc:
		return cli.Fail(stderr, name, err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		logger.Warn("webhook server did not stop cleanly", slog.Any("error", err))
	}
	logger.Info("stopped cleanly")
	return cli.ExitOK
}
