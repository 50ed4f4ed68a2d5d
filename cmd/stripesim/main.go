// Command stripesim runs the pelguard Stripe emulator as a standalone
// server for the drill and for manual poking with stripe-go or curl.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/cmdname"
	"github.com/pelguard/pelguard/internal/stripesim"
)

// synopsis and description are --help's text: what stripesim is and how to
// point pelguard at it, for someone trying pelguard, not for a Go
// programmer.
const synopsis = `stripesim [flags]
       stripesim version | --version`

const description = `stripesim is a local Stripe emulator for trying pelguard without a Stripe
account: an in-memory stand-in for Stripe's API (customers, charges,
PaymentIntents, refunds, billing meters and meter events) that keeps every
charge and event until it stops. Nothing it
does reaches Stripe. It listens on --addr (default 127.0.0.1:12111),
prints its URL, and serves until Ctrl-C.

Point pelguard at it with the Stripe API base and any test key:

    export STRIPE_API_BASE=http://127.0.0.1:12111   # or --stripe-api-base
    export STRIPE_API_KEY=sk_test_anything           # any sk_test_ key works
    ` + cmdname.Consumer + ` run --stream billing-stream --group billing-group

Restricted keys (rk_test_...) need their permissions: --rk below.

Look at what happened, or break things on purpose, over HTTP:
    curl http://127.0.0.1:12111/_sim/charges       every charge made
    curl http://127.0.0.1:12111/_sim/duplicates    customers charged twice for a period
    curl http://127.0.0.1:12111/_sim/requests      the requests received
    curl http://127.0.0.1:12111/_sim/meters        billing meters and meter-event counts
    curl -d '{"error_rate":0.1}' http://127.0.0.1:12111/_sim/faults     10 % of requests fail
    curl -d '{"duration":"24h"}' http://127.0.0.1:12111/_sim/advance    move its clock a day
    curl http://127.0.0.1:12111/_sim/faults        the faults in force, every field`

// rkFlags collects repeated --rk KEY=perm,perm flags.
type rkFlags map[string][]string

func (r rkFlags) String() string {
	var keys []string
	for k, perms := range r {
		keys = append(keys, k+"="+strings.Join(perms, ","))
	}
	slices.Sort(keys)
	return strings.Join(keys, " ")
}

func (r rkFlags) Set(v string) error {
	key, perms, ok := strings.Cut(v, "=")
	if !ok || !strings.HasPrefix(key, "rk_") {
		return fmt.Errorf("want rk_...=perm,perm, got %q", v)
	}
	r[key] = strings.Split(perms, ",")
	return nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run serves until ctx ends; a bad flag is exit 2 with a message naming it.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	// `stripesim version` and --version answer without starting a server.
	if len(args) > 0 && (args[0] == "version" || cli.IsVersionFlag(args[0])) {
		cli.PrintVersion(stdout, "stripesim")
		return cli.ExitOK
	}
	fs := cli.NewFlagSet("stripesim", synopsis, description, stderr)
	rks := rkFlags{}
	addr := fs.String("addr", "127.0.0.1:12111", "listen address")
	latency := fs.Duration("latency", 0, "fixed latency added to every /v1 request")
	errorRate := fs.Float64("error-rate", 0, "fraction of /v1 requests answered 500 before executing, 0 to 1")
	rateLimit := fs.Float64("rate-limit", 0, "requests per second before 429 rate_limit (0 = unlimited)")
	meterRate := fs.Float64("meter-event-rate-limit", 0, "meter events per second before 429 rate_limit, Stripe's limit of their own (1000 in live mode; 0 = unlimited)")
	meterLatency := fs.Duration("meter-event-latency", 0, "how long each meter event is in flight, holding its customer and meter (a second call meanwhile: 429)")
	seed := fs.Int64("seed", 1, "seed for fault decisions")
	fs.Var(rks, "rk", "restricted key and its permissions, e.g. rk_test_auditor=charges_read,payment_intents_read (repeatable)")
	if err := cli.ParseFlags(fs, args); err != nil {
		return cli.Fail(stderr, "stripesim", err)
	}
	switch {
	case *latency < 0:
		return cli.Fail(stderr, "stripesim", cli.Usagef("--latency %s: want 0 or more", *latency))
	case *meterLatency < 0:
		return cli.Fail(stderr, "stripesim", cli.Usagef("--meter-event-latency %s: want 0 or more", *meterLatency))
	case *errorRate < 0 || *errorRate > 1:
		return cli.Fail(stderr, "stripesim", cli.Usagef("--error-rate %v: want a fraction from 0 to 1 (0.1: one request in ten fails)", *errorRate))
	case *rateLimit < 0:
		return cli.Fail(stderr, "stripesim", cli.Usagef("--rate-limit %v: want 0 (unlimited) or more", *rateLimit))
	case *meterRate < 0:
		return cli.Fail(stderr, "stripesim", cli.Usagef("--meter-event-rate-limit %v: want 0 (unlimited) or more", *meterRate))
	}

	log := slog.New(slog.NewTextHandler(stderr, nil))
	srv, err := stripesim.New(stripesim.Config{
		Addr:   *addr,
		Seed:   *seed,
		Logger: log,
		Faults: stripesim.Faults{
			Latency:   stripesim.Latency{Fixed: *latency},
			ErrorRate: *errorRate,
			RateLimit: *rateLimit,

			MeterEventRateLimit: *meterRate,
			MeterEventLatency:   *meterLatency,
		},
	})
	if err != nil {
		return cli.Fail(stderr, "stripesim", err)
	}
	for key, perms := range rks {
		srv.SetKeyPermissions(key, perms...)
	}
	fmt.Fprintln(stdout, srv.URL())
	<-ctx.Done()
	log.Info("stopping", slog.Int64("charge_creates", srv.ChargeCreates()))
	srv.Close()
	return cli.ExitOK
}
