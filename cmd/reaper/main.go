// Command reaper recovers what dead billing consumers leave pending, checking
// the ledger before every claim. It replaces the naive XAUTOCLAIM monitor.
//
//	reaper [run] [flags]             a pass every --interval until SIGTERM/SIGINT
//	reaper --once [flags]            one pass (cron)
//	reaper --dry-run [--json] ...    print every decision, change nothing
//	reaper migrate up|down|status
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/reaper"
)

const prog = "reaper"

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "migrate":
			return cli.Migrate(ctx, prog, args[1:], stdout, stderr)
		case "run":
			args = args[1:]
		}
	}
	return runReaper(ctx, args, stdout, stderr)
}

const description = `Recovers entries that dead consumers left in a billing stream's pending entries list, without
ever claiming one a live consumer is working on. Per pass and stream: XPENDING IDLE --min-idle,
bodies and ledger rows per page, then per entry: body gone → ack; invalid → dead letter + ack;
ledger terminal → ack (already billed: never redelivered); live ledger lease → skip; delivered
--max-deliveries times → dead letter + ack + alert; otherwise XCLAIM with the same min-idle and
re-drive through the consumer's own code. A re-drive that Stripe fails transiently (5xx, 429,
timeout) does not count as a delivery: a Stripe outage never dead-letters events by itself. Idle
consumers with nothing pending are removed.

--dry-run prints every decision (a table, or JSON lines with --json) and changes nothing: run it
beside the old monitor, compare, then switch. --once runs one pass and exits (cron).

Subcommands: run (default), migrate up|down|status.
Environment: REDIS_URL, DATABASE_URL, STRIPE_API_KEY, STRIPE_API_BASE, SLACK_WEBHOOK_URL,
SLACK_BOT_TOKEN, SLACK_CHANNEL. The re-drive settings (--namespace above all, --lease, --require-cap,
--max-amount-cents, --strict-fields) must match the consumers'.

Stripe permissions: the consumer's, since re-drives charge through the same code: PaymentIntents
Write (Charges Write with --stripe-mode charges), Charges Read, PaymentIntents Read, Customers Read
(payment_intents mode on live Stripe). --dry-run needs no key. An unrestricted sk_live_ key is
refused unless --allow-unrestricted-key.`

type flags struct {
	redisURL, dbURL string
	schema          string
	streams         cli.Streams
	group           string
	name, namespace string
	minIdle         time.Duration
	interval        time.Duration
	pageSize        int64
	pageWorkers     int
	maxDeliveries   int64
	workers         int
	consumerIdle    time.Duration
	lease           time.Duration
	safeWindow      time.Duration
	requireCap      bool
	chargeMetadata  bool
	maxAmount       int64
	strictFields    bool
	dryRun, once    bool
	jsonOut         bool
	shutdownTimeout time.Duration
	metricsAddr     string
	log             cli.Logging
	stripe          cli.Stripe
	slack           cli.Slack
}

func runReaper(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var f flags
	fs := cli.NewFlagSet(prog, prog+" [run] [flags]", description, stderr)
	cli.RegisterRedis(fs, &f.redisURL)
	cli.RegisterDatabase(fs, &f.dbURL)
	cli.RegisterSchema(fs, &f.schema)
	cli.RegisterStreams(fs, &f.streams, &f.group, "reap")
	fs.StringVar(&f.name, "name", cli.Env("PELGUARD_REAPER_NAME", ""), "consumer name the reaper claims to; empty: reaper-host-pid-random [PELGUARD_REAPER_NAME]")
	fs.StringVar(&f.namespace, "namespace", cli.Env("PELGUARD_NAMESPACE", consumer.DefaultNamespace), "idempotency-key namespace; must match the consumers' [PELGUARD_NAMESPACE]")
	fs.DurationVar(&f.minIdle, "min-idle", cli.EnvDuration("PELGUARD_MIN_IDLE", reaper.DefaultMinIdle), "consider entries idle at least this long; also the XCLAIM fence.\nKeep it well above the consumers' heartbeat (lease/3) [PELGUARD_MIN_IDLE]")
	fs.DurationVar(&f.interval, "interval", reaper.DefaultInterval, "time between passes (without --once)")
	fs.Int64Var(&f.pageSize, "page-size", reaper.DefaultPageSize, "XPENDING COUNT per page; one ledger query per page")
	fs.IntVar(&f.pageWorkers, "page-workers", reaper.DefaultPageWorkers, "pages decided at once")
	fs.Int64Var(&f.maxDeliveries, "max-deliveries", reaper.DefaultMaxDeliveries, "dead-letter (and alert) an entry delivered this many times")
	fs.IntVar(&f.workers, "workers", reaper.DefaultWorkers, "re-drives (Stripe calls) at once")
	fs.DurationVar(&f.consumerIdle, "consumer-idle", reaper.DefaultConsumerIdle, "remove consumers idle this long with nothing pending (0: never)")
	fs.DurationVar(&f.lease, "lease", consumer.DefaultLease, "ledger lease of a re-drive; renewed every lease/3")
	fs.DurationVar(&f.safeWindow, "safe-key-window", consumer.DefaultSafeKeyWindow, "after this long since the first attempt, look the charge up at Stripe before charging again")
	fs.BoolVar(&f.chargeMetadata, "charge-metadata", cli.EnvBool("PELGUARD_CHARGE_METADATA", true), "send pelguard's metadata with each charge; false sends the article's request shape (with --stripe-mode charges and the team's --namespace, Stripe then accepts pelguard's charge under a key the team already used) [PELGUARD_CHARGE_METADATA]")
	fs.BoolVar(&f.requireCap, "require-cap", cli.EnvBool("PELGUARD_REQUIRE_CAP", false), "refuse to charge a billing period without a spend cap [PELGUARD_REQUIRE_CAP]")
	fs.Int64Var(&f.maxAmount, "max-amount-cents", event.DefaultMaxAmountCents, "reject events above this amount")
	fs.BoolVar(&f.strictFields, "strict-fields", false, "reject events with fields other than the five known ones")
	fs.BoolVar(&f.dryRun, "dry-run", false, "print every decision and change nothing (no Stripe key needed)")
	fs.BoolVar(&f.jsonOut, "json", false, "with --dry-run: print decisions as JSON lines instead of a table")
	fs.BoolVar(&f.once, "once", false, "run one pass, wait for its re-drives, and exit")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long re-drives in flight may take to finish")
	fs.StringVar(&f.metricsAddr, "metrics-addr", cli.Env("PELGUARD_REAPER_METRICS_ADDR", "127.0.0.1:9465"), "address of /metrics, /healthz, /readyz (empty: off) [PELGUARD_REAPER_METRICS_ADDR]")
	f.log.Register(fs)
	f.stripe.Register(fs)
	f.slack.Register(fs)
	if err := cli.Parse(fs, args); err != nil {
		return cli.Fail(stderr, prog, err)
	}
	if fs.NArg() > 0 {
		return cli.Fail(stderr, prog, cli.Usagef("unexpected argument %q", fs.Arg(0)))
	}
	pairs, err := f.streams.Resolve(f.group)
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	streams := make([]reaper.StreamGroup, len(pairs))
	for i, p := range pairs {
		streams[i] = reaper.StreamGroup{Stream: p.Stream, Group: p.Group}
	}
	if f.jsonOut && !f.dryRun {
		return cli.Fail(stderr, prog, cli.Usagef("--json formats --dry-run's decisions; add --dry-run (live decisions are logged at debug)"))
	}
	logger, err := f.log.Logger(stderr)
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	reg := cli.NewRegistry()

	var sc consumer.Stripe
	if !f.dryRun {
		c, err := f.stripe.Client(logger, nil)
		if err != nil {
			return cli.Fail(stderr, prog, err)
		}
		sc = c
	}
	notifier, err := f.slack.Notifier(logger, reg)
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	defer closeNotifier(notifier)

	rdb, err := cli.OpenRedis(ctx, f.redisURL)
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	defer rdb.Close()
	pool, err := cli.OpenDB(ctx, prog, f.dbURL, f.schema, int32(f.workers+f.pageWorkers*len(streams)+4))
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	defer pool.Close()
	if err := cli.CheckClock(ctx, pool, f.lease/3, "a third of --lease"); err != nil {
		return cli.Fail(stderr, prog, err)
	}

	consumerIdle := f.consumerIdle
	if consumerIdle == 0 {
		consumerIdle = -1 // the flag's 0 means never; the library's 0 means its default
	}
	var printer *decisionPrinter
	if f.dryRun {
		printer = newDecisionPrinter(stdout, f.jsonOut)
	}
	cfg := reaper.Config{
		Redis: rdb, DB: pool, Schema: f.schema, Stripe: sc, Streams: streams,
		Name: f.name, MinIdle: f.minIdle, Interval: f.interval, PageSize: f.pageSize, PageWorkers: f.pageWorkers,
		MaxDeliveries: f.maxDeliveries, Workers: f.workers, ConsumerIdle: consumerIdle, DryRun: f.dryRun,
		Namespace: f.namespace, Lease: f.lease, SafeKeyWindow: f.safeWindow, RequireCap: f.requireCap, OmitChargeMetadata: !f.chargeMetadata,
		Rules:    event.Rules{MaxAmountCents: f.maxAmount, StrictFields: f.strictFields},
		Notifier: notifier, Metrics: reaper.NewMetrics(reg), ConsumerMetrics: consumer.NewMetrics(reg), Logger: logger,
	}
	if printer != nil {
		cfg.OnDecision = printer.print
	}
	r, err := reaper.New(cfg)
	if err != nil {
		return cli.Fail(stderr, prog, cli.Usagef("%v", err))
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
	logger.Info("reaper starting", "name", r.Name(), "streams", fmt.Sprint(streams), "min_idle", f.minIdle,
		"dry_run", f.dryRun, "once", f.once)
	if f.once {
		sum, err := r.RunOnce(sigCtx)
		if printer != nil && !f.jsonOut {
			printer.summary(sum)
		}
		if err != nil {
			return cli.Fail(stderr, prog, err)
		}
		return cli.ExitOK
	}
	if err := r.Start(ctx); err != nil {
		return cli.Fail(stderr, prog, err)
	}
	<-sigCtx.Done()
	logger.Info("stopping: finishing re-drives in flight", "timeout", f.shutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), f.shutdownTimeout)
	defer cancel()
	if err := r.Stop(sctx); err != nil {
		logger.Error("stopped with re-drives unfinished; their entries stay pending and are safe to redeliver", "error", err)
		return cli.ExitError
	}
	logger.Info("stopped cleanly")
	return cli.ExitOK
}

func closeNotifier(n alerts.Notifier) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = n.Close(ctx)
}

// decisionPrinter writes decisions as they are made: from several
// goroutines, so behind a lock, and line by line so a long pass streams.
type decisionPrinter struct {
	mu     sync.Mutex
	w      io.Writer
	json   bool
	header bool
}

func newDecisionPrinter(w io.Writer, asJSON bool) *decisionPrinter {
	return &decisionPrinter{w: w, json: asJSON}
}

const rowFormat = "%-8s  %-24s  %-20s  %-24s  %9s  %5s  %-15s  %-24s  %s\n"

func (p *decisionPrinter) print(d reaper.Decision) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.json {
		b, _ := json.Marshal(d) // plain struct: cannot fail
		fmt.Fprintf(p.w, "%s\n", b)
		return
	}
	if !p.header {
		fmt.Fprintf(p.w, rowFormat, "TIME", "STREAM", "ID", "CONSUMER", "IDLE", "DELIV", "DECISION", "KEY", "DETAIL")
		p.header = true
	}
	detail := d.Reason
	if d.Outcome != "" {
		detail = strings.TrimSpace("outcome=" + string(d.Outcome) + " " + detail)
	}
	if d.Error != "" {
		detail = strings.TrimSpace(detail + " error=" + d.Error)
	}
	fmt.Fprintf(p.w, rowFormat, d.Time.UTC().Format("15:04:05"), d.Stream, d.ID, d.Consumer,
		d.Idle.Round(time.Millisecond), fmt.Sprint(d.Deliveries), d.Kind, d.Key, detail)
}

func (p *decisionPrinter) summary(s reaper.PassSummary) {
	p.mu.Lock()
	defer p.mu.Unlock()
	kinds := make([]string, 0, len(s.Decisions))
	for k, n := range s.Decisions {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, n))
	}
	slices.Sort(kinds)
	fmt.Fprintf(p.w, "\n%d pending entries idle past --min-idle; would decide: %s (dry run: nothing changed)\n",
		s.Scanned, strings.Join(kinds, " "))
}
