// Command stripesim runs the pelguard Stripe emulator as a standalone
// server for the drill and for manual poking with stripe-go or curl.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/cmdname"
	"github.com/pelguard/pelguard/internal/stripesim"
)

// usage is --help's text: what stripesim is and how to point pelguard at
// it, for someone trying pelguard, not for a Go programmer.
const usage = `Usage: stripesim [flags]
       stripesim version | --version

stripesim is a local Stripe emulator for trying pelguard without a Stripe
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
    curl http://127.0.0.1:12111/_sim/faults        the faults in force, every field

Flags:
`

// rkFlags collects repeated --rk KEY=perm,perm flags.
type rkFlags map[string][]string

func (r rkFlags) String() string { return fmt.Sprint(map[string][]string(r)) }

func (r rkFlags) Set(v string) error {
	key, perms, ok := strings.Cut(v, "=")
	if !ok || !strings.HasPrefix(key, "rk_") {
		return fmt.Errorf("want rk_...=perm,perm, got %q", v)
	}
	r[key] = strings.Split(perms, ",")
	return nil
}

func main() {
	// `stripesim version` and --version answer without starting a server.
	if len(os.Args) > 1 && (os.Args[1] == "version" || cli.IsVersionFlag(os.Args[1])) {
		cli.PrintVersion(os.Stdout, "stripesim")
		return
	}
	rks := rkFlags{}
	addr := flag.String("addr", "127.0.0.1:12111", "listen address")
	latency := flag.Duration("latency", 0, "fixed latency added to every /v1 request")
	errorRate := flag.Float64("error-rate", 0, "fraction of /v1 requests answered 500 before executing")
	rateLimit := flag.Float64("rate-limit", 0, "requests per second before 429 rate_limit (0 = unlimited)")
	meterRate := flag.Float64("meter-event-rate-limit", 0, "meter events per second before 429 rate_limit, Stripe's limit of their own (1000 in live mode; 0 = unlimited)")
	meterLatency := flag.Duration("meter-event-latency", 0, "how long each meter event is in flight, holding its customer and meter (a second call meanwhile: 429)")
	seed := flag.Int64("seed", 1, "seed for fault decisions")
	flag.Var(rks, "rk", "restricted key and its permissions, e.g. rk_test_auditor=charges_read,payment_intents_read (repeatable)")
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), usage)
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "stripesim: unexpected argument %q (the only command is version)\n", flag.Arg(0))
		os.Exit(2)
	}

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
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
		log.Error("starting", slog.Any("err", err))
		os.Exit(1)
	}
	for key, perms := range rks {
		srv.SetKeyPermissions(key, perms...)
	}
	fmt.Println(srv.URL())

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	log.Info("stopping", slog.Int64("charge_creates", srv.ChargeCreates()))
	srv.Close()
}
