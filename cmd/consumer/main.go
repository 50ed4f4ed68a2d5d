// Command consumer charges billing events from a Redis Stream consumer group
// through Stripe, exactly once per customer and billing period.
//
//	consumer [run] [flags]              consume until SIGTERM/SIGINT
//	consumer cap set --period P --cents N
//	consumer cap show
//	consumer replay --reason R [--limit N] [--dry-run]
//	consumer migrate up|down|status
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/ledger"
)

const prog = "consumer"

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "migrate":
			return cli.Migrate(ctx, prog, args[1:], stdout, stderr)
		case "cap":
			return capCmd(ctx, args[1:], stdout, stderr)
		case "replay":
			return replayCmd(ctx, args[1:], stdout, stderr)
		case "import":
			return cli.Import(ctx, prog, args[1:], stdout, stderr)
		case "run":
			args = args[1:]
		}
	}
	return runConsumer(ctx, args, stderr)
}

const description = `Reads billing events from a Redis Stream consumer group and charges each customer once per
billing period through Stripe. Every event is checked against and recorded in the Postgres
ledger (billing_records) before it is acked; a heartbeat keeps slow Stripe calls from being
reclaimed; bad events go to <stream>:dead with the reason. Several --stream values run one
consumer per stream in this process (e.g. hash-tagged streams on a Redis Cluster).

Subcommands: run (default), cap set|show, replay, import, migrate up|down|status|move.
Environment: REDIS_URL, DATABASE_URL, STRIPE_API_KEY, STRIPE_API_BASE, SLACK_WEBHOOK_URL,
SLACK_BOT_TOKEN, SLACK_CHANNEL. On SIGTERM it stops reading, finishes events in flight and
exits 0 within --shutdown-timeout.

Stripe permissions (a restricted key, rk_live_…): PaymentIntents Write (Charges Write with
--stripe-mode charges), Charges Read, PaymentIntents Read (the lookup past --safe-key-window),
Customers Read (payment_intents mode on live Stripe: the default payment method). An unrestricted
sk_live_ key is refused unless --allow-unrestricted-key. A 403 names the missing permission: the
event is dead-lettered (stripe_key_error; its ledger row stays pending: replay it once the key is
fixed) and Slack is told once per permission.`

type flags struct {
	redisURL, dbURL    string
	schema             string
	streams            cli.Streams
	group              string
	name, namespace    string
	count              int64
	block              time.Duration
	workers            int
	lease, safeWindow  time.Duration
	requireCap         bool
	chargeMetadata     bool
	maxAmount          int64
	strictFields       bool
	shutdownTimeout    time.Duration
	metricsAddr        string
	deadLetterInterval time.Duration
	log                cli.Logging
	stripe             cli.Stripe
	slack              cli.Slack
}

func runConsumer(ctx context.Context, args []string, stderr io.Writer) int {
	var f flags
	fs := cli.NewFlagSet(prog, prog+" [run] [flags]", description, stderr)
	cli.RegisterRedis(fs, &f.redisURL)
	cli.RegisterDatabase(fs, &f.dbURL)
	cli.RegisterSchema(fs, &f.schema)
	cli.RegisterStreams(fs, &f.streams, &f.group, "consume (one consumer per stream, each with --workers)")
	fs.StringVar(&f.name, "name", cli.Env("PELGUARD_CONSUMER_NAME", ""), "pinned consumer name (e.g. a StatefulSet pod name): drains its own pending entries after a restart;\nempty: unique per process (host-pid-random) [PELGUARD_CONSUMER_NAME]")
	fs.StringVar(&f.namespace, "namespace", cli.Env("PELGUARD_NAMESPACE", consumer.DefaultNamespace), "idempotency-key namespace; give each environment its own [PELGUARD_NAMESPACE]")
	fs.Int64Var(&f.count, "count", consumer.DefaultCount, "XREADGROUP COUNT (acks are always per event)")
	fs.DurationVar(&f.block, "block", consumer.DefaultBlock, "XREADGROUP BLOCK")
	fs.IntVar(&f.workers, "workers", consumer.DefaultWorkers, "events handled at once")
	fs.DurationVar(&f.lease, "lease", consumer.DefaultLease, "ledger lease; the heartbeat renews it every lease/3")
	fs.DurationVar(&f.safeWindow, "safe-key-window", consumer.DefaultSafeKeyWindow, "after this long since the first attempt, look the charge up at Stripe before charging again")
	fs.BoolVar(&f.chargeMetadata, "charge-metadata", cli.EnvBool("PELGUARD_CHARGE_METADATA", true), "send pelguard's metadata with each charge; false sends the article's request shape (with --stripe-mode charges and the team's --namespace, Stripe then accepts pelguard's charge under a key the team already used) [PELGUARD_CHARGE_METADATA]")
	fs.BoolVar(&f.requireCap, "require-cap", cli.EnvBool("PELGUARD_REQUIRE_CAP", false), "refuse to charge a billing period without a spend cap [PELGUARD_REQUIRE_CAP]")
	fs.Int64Var(&f.maxAmount, "max-amount-cents", event.DefaultMaxAmountCents, "reject events above this amount")
	fs.BoolVar(&f.strictFields, "strict-fields", false, "reject events with fields other than the five known ones")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long events in flight may take to finish")
	fs.StringVar(&f.metricsAddr, "metrics-addr", cli.Env("PELGUARD_METRICS_ADDR", "127.0.0.1:9464"), "address of /metrics, /healthz, /readyz (empty: off) [PELGUARD_METRICS_ADDR]")
	fs.DurationVar(&f.deadLetterInterval, "dead-letter-alert-interval", time.Minute, "dead-letter alerts are aggregated over this interval")
	f.log.Register(fs)
	f.stripe.Register(fs)
	f.slack.Register(fs)
	if err := cli.Parse(fs, args); err != nil {
		return cli.Fail(stderr, prog, err)
	}
	if fs.NArg() > 0 {
		return cli.Fail(stderr, prog, cli.Usagef("unexpected argument %q", fs.Arg(0)))
	}
	streams, err := f.streams.Resolve(f.group)
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	logger, err := f.log.Logger(stderr)
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	reg := cli.NewRegistry()
	metrics := consumer.NewMetrics(reg)
	sc, err := f.stripe.Client(logger, nil)
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	notifier, err := f.slack.Notifier(logger, reg)
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	defer closeNotifier(notifier)
	dl := alerts.NewDeadLetterAggregator(notifier, f.deadLetterInterval, nil)
	defer func() { _ = dl.Stop(context.Background()) }()

	rdb, err := cli.OpenRedis(ctx, f.redisURL)
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	defer rdb.Close()
	pool, err := cli.OpenDB(ctx, prog, f.dbURL, f.schema, int32(len(streams)*f.workers*2+4))
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	defer pool.Close()
	if err := cli.CheckClock(ctx, pool, f.lease/3, "a third of --lease"); err != nil {
		return cli.Fail(stderr, prog, err)
	}

	cs := make([]*consumer.Consumer, len(streams))
	for i, sg := range streams {
		cs[i], err = consumer.New(consumer.Config{
			Redis: rdb, DB: pool, Schema: f.schema, Stripe: sc,
			Stream: sg.Stream, Group: sg.Group, Name: f.name, Namespace: f.namespace,
			Count: f.count, Block: f.block, Workers: f.workers, Lease: f.lease, SafeKeyWindow: f.safeWindow,
			RequireCap: f.requireCap, Rules: event.Rules{MaxAmountCents: f.maxAmount, StrictFields: f.strictFields}, OmitChargeMetadata: !f.chargeMetadata,
			Notifier: notifier, DeadLetters: dl, Metrics: metrics, Logger: logger,
		})
		if err != nil {
			return cli.Fail(stderr, prog, cli.Usagef("%v", err))
		}
	}
	ops, err := cli.ServeOps(f.metricsAddr, reg, []cli.Check{
		{Name: "redis", Fn: func(ctx context.Context) error { return rdb.Ping(ctx).Err() }},
		{Name: "postgres", Fn: pool.Ping},
	}, logger)
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	defer func() { _ = ops.Close(context.Background()) }()

	sigCtx, stop := cli.SignalContext(ctx)
	defer stop()
	// Any consumer that ends by itself (a fatal error) stops the process.
	ended := make(chan struct{}, len(cs))
	for i, c := range cs {
		if err := c.Start(ctx); err != nil {
			stopAll(cs[:i], f.shutdownTimeout, logger)
			return cli.Fail(stderr, prog, err)
		}
		go func() { <-c.Done(); ended <- struct{}{} }()
		logger.Info("consumer started", "name", c.Name(), "stream", streams[i].Stream, "group", streams[i].Group,
			"workers", f.workers, "count", f.count)
	}
	select {
	case <-sigCtx.Done():
		logger.Info("stopping: finishing events in flight", "timeout", f.shutdownTimeout)
	case <-ended:
	}
	if !stopAll(cs, f.shutdownTimeout, logger) {
		return cli.ExitError
	}
	logger.Info("stopped cleanly")
	return cli.ExitOK
}

// stopAll stops the consumers at once, sharing one timeout; false when any
// stopped with events unfinished (they stay pending: safe to redeliver).
func stopAll(cs []*consumer.Consumer, timeout time.Duration, logger *slog.Logger) bool {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var (
		wg    sync.WaitGroup
		clean atomic.Bool
	)
	clean.Store(true)
	for _, c := range cs {
		wg.Go(func() {
			if err := c.Stop(ctx); err != nil {
				clean.Store(false)
				logger.Error("stopped with events unfinished; they stay pending and are safe to redeliver",
					"stream", c.Stream(), "error", err)
			}
		})
	}
	wg.Wait()
	return clean.Load()
}

func closeNotifier(n alerts.Notifier) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = n.Close(ctx)
}

func capCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "set" && args[0] != "show") {
		fmt.Fprintln(stderr, "Usage: consumer cap set --period P --cents N | consumer cap show [--period P]")
		return cli.ExitError
	}
	verb := args[0]
	fs := cli.NewFlagSet(prog+" cap "+verb, prog+" cap set --period P --cents N | cap show [--period P]",
		"Spend caps bound what may be charged per billing period (the seed's 'vault key', e.g. 110% of\n"+
			"the expected total). An event that would pass the cap is dead-lettered with reason spend_cap and\n"+
			"can be replayed after the cap is raised.", stderr)
	var dbURL, schema, period string
	var cents int64 = -1
	cli.RegisterDatabase(fs, &dbURL)
	cli.RegisterSchema(fs, &schema)
	fs.StringVar(&period, "period", "", "billing period, e.g. 2026-11")
	fs.Int64Var(&cents, "cents", -1, "cap in cents (set)")
	if err := cli.Parse(fs, args[1:]); err != nil {
		return cli.Fail(stderr, prog+" cap", err)
	}
	if verb == "set" && (period == "" || cents < 0) {
		return cli.Fail(stderr, prog+" cap set", cli.Usagef("--period and a non-negative --cents are required"))
	}
	pool, err := cli.OpenDB(ctx, prog, dbURL, schema, 2)
	if err != nil {
		return cli.Fail(stderr, prog+" cap", err)
	}
	defer pool.Close()
	l := ledger.New(pool, schema, nil)
	var caps []ledger.Cap
	switch {
	case verb == "set":
		c, err := l.SetCap(ctx, period, cents)
		if err != nil {
			return cli.Fail(stderr, prog+" cap set", err)
		}
		caps = []ledger.Cap{c}
	case period != "":
		c, err := l.Cap(ctx, period)
		if err != nil {
			return cli.Fail(stderr, prog+" cap show", err)
		}
		caps = []ledger.Cap{c}
	default:
		if caps, err = l.Caps(ctx); err != nil {
			return cli.Fail(stderr, prog+" cap show", err)
		}
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PERIOD\tCAP\tRESERVED\tLEFT\tUPDATED")
	for _, c := range caps {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.BillingPeriod, money(c.CapCents), money(c.ReservedCents),
			money(c.CapCents-c.ReservedCents), c.UpdatedAt.UTC().Format(time.RFC3339))
	}
	if len(caps) == 0 {
		fmt.Fprintln(tw, "(no caps)")
	}
	_ = tw.Flush()
	return cli.ExitOK
}

func money(cents int64) string {
	s := fmt.Sprintf("%d.%02d", cents/100, abs(cents%100))
	if cents < 0 && !strings.HasPrefix(s, "-") {
		s = "-" + s
	}
	return s
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

func replayCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet(prog+" replay", prog+" replay [--stream S]... [--reason R] [--limit N] [--dry-run]",
		"Puts dead letters back on the stream with their original fields, oldest first, and removes\n"+
			"them from <stream>:dead: for events parked as spend_cap or no_spend_cap (after raising or\n"+
			"setting the cap) or stripe_key_error (after fixing the key). The ledger makes a replay safe:\n"+
			"an event already billed is acked without a second charge.", stderr)
	var (
		redisURL, reason, group string
		streams                 cli.Streams
		limit                   int
		dryRun                  bool
	)
	cli.RegisterRedis(fs, &redisURL)
	cli.RegisterStreams(fs, &streams, &group, "replay the dead letters of")
	fs.StringVar(&reason, "reason", "", "only dead letters with this reason (e.g. spend_cap, stripe_key_error); empty: all")
	fs.IntVar(&limit, "limit", 0, "replay at most this many per stream (0: all)")
	fs.BoolVar(&dryRun, "dry-run", false, "list what would be replayed, change nothing")
	if err := cli.Parse(fs, args); err != nil {
		return cli.Fail(stderr, prog+" replay", err)
	}
	if limit < 0 {
		return cli.Fail(stderr, prog+" replay", cli.Usagef("--limit must not be negative"))
	}
	pairs, err := streams.Resolve(group)
	if err != nil {
		return cli.Fail(stderr, prog+" replay", err)
	}
	rdb, err := cli.OpenRedis(ctx, redisURL)
	if err != nil {
		return cli.Fail(stderr, prog+" replay", err)
	}
	defer rdb.Close()
	verb := "replayed"
	if dryRun {
		verb = "would replay"
	}
	seen := map[string]bool{} // a stream read by two groups has one dead-letter stream
	for _, sg := range pairs {
		if seen[sg.Stream] {
			continue
		}
		seen[sg.Stream] = true
		done, err := consumer.ReplayDeadLetters(ctx, rdb, sg.Stream, reason, limit, dryRun)
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "DEAD LETTER\tSOURCE\tREASON\tREPLAYED AS")
		for _, r := range done {
			as := r.NewID
			if dryRun {
				as = "(dry run)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.DeadID, r.SourceID, r.Reason, as)
		}
		_ = tw.Flush()
		fmt.Fprintf(stdout, "%s %d dead letter(s) onto %s\n", verb, len(done), sg.Stream)
		if err != nil {
			return cli.Fail(stderr, prog+" replay", err)
		}
	}
	return cli.ExitOK
}
