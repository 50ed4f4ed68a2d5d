package reapercli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/streamfacts"
	"github.com/pelguard/pelguard/reaper"
	"github.com/pelguard/pelguard/stripeapi"
	"github.com/pelguard/pelguard/stripelimit"
)

const runDescription = `Recovers entries that dead consumers left in a billing stream's pending entries list, without
ever claiming one a live consumer is working on. Per pass and stream: XPENDING IDLE --min-idle,
bodies and ledger rows per page, then per entry: body gone → ack; invalid → dead letter + ack;
ledger terminal → ack (already billed: never redelivered); live ledger lease → skip; delivered
--max-deliveries times → dead letter + ack + alert; otherwise XCLAIM with the same min-idle and
re-drive through the consumer's own code. A re-drive that Stripe fails transiently (5xx, 429,
timeout) does not count as a delivery: a Stripe outage never dead-letters events by itself. Idle
consumers with nothing pending are removed.

--dry-run prints every decision (a table, or JSON lines with --json) and changes nothing: run it
beside the old monitor, compare, then switch. --once runs one pass and exits (cron).

Environment: REDIS_URL, DATABASE_URL, STRIPE_API_KEY, STRIPE_API_BASE, SLACK_WEBHOOK_URL,
SLACK_BOT_TOKEN, SLACK_CHANNEL. The re-drive settings (--namespace above all, --lease, --require-cap,
--max-amount-cents, --strict-fields) must match the consumers'. At start it waits up to
--wait-for-deps for Redis and Postgres. Exit status: 0 ok, 2 bad flags or configuration, a failed
--once pass or re-drives left unfinished at stop, 3 Redis or Postgres still unreachable after
--wait-for-deps.

Stripe permissions: the consumer's, since re-drives charge through the same code: PaymentIntents
Write (Charges Write with --stripe-mode charges), Charges Read, PaymentIntents Read, Customers Read
(payment_intents mode on live Stripe). --dry-run needs no key. An unrestricted sk_live_ key is
refused unless --allow-unrestricted-key.`

// RunOptions are the flags of `reaper run`.
type RunOptions struct {
	cli.RoleFlags
	cli.Charging
	StoppedConsumers   string
	ExternalLedger     string
	ExternalMaxCall    time.Duration
	ExternalInsert     string
	MeterStreams       cli.Streams
	MeterSafeWindow    time.Duration
	Name               string
	MinIdle            time.Duration
	Interval           time.Duration
	PageSize           int64
	PageWorkers        int
	MaxDeliveries      int64
	Workers            int
	ConsumerIdle       time.Duration // 0: never remove idle consumers
	StreamRetention    time.Duration // 0: never trim
	DeadLetterMax      int64         // 0: no size alert
	DeadLetterMaxAge   time.Duration // 0: no age alert
	Lease              time.Duration
	DryRun, Once, JSON bool
	ShutdownTimeout    time.Duration

	streams      []reaper.StreamGroup // resolved by Validate
	meterStreams []reaper.StreamGroup
}

func (o *RunOptions) register(fs *flag.FlagSet) {
	o.RoleFlags.Register(fs, cli.ReaperMetrics.Verb("reap"))
	o.Charging.Register(fs, "must match the consumers'")
	fs.StringVar(&o.StoppedConsumers, "stopped-consumers", cli.Env("PELGUARD_STOPPED_CONSUMERS", ""), "comma-separated group members that never registered as pelguard consumers (a team's old consumers) and are stopped: their entries are re-driven after the ledger check instead of left alone [PELGUARD_STOPPED_CONSUMERS]")
	fs.StringVar(&o.ExternalLedger, "external-ledger", cli.Env("PELGUARD_EXTERNAL_LEDGER", ""), "a team's own billing table (schema.table; columns customer_id, billing_period, charge_id, status) that is the ledger: keep the team's consumer, replace only its stuck-message monitor. Needs --external-max-call and --stripe-mode charges [PELGUARD_EXTERNAL_LEDGER]")
	fs.StringVar(&o.ExternalInsert, "external-insert", cli.Env("PELGUARD_EXTERNAL_INSERT", ""), "with --external-ledger, for a table of another shape: the team consumer's INSERT with $1 customer_id, $2 billing_period, $3 charge_id (NULL on a decline), $4 amount_cents, $5 status, $6 error; empty: the common INSERT … ON CONFLICT DO NOTHING [PELGUARD_EXTERNAL_INSERT]")
	fs.DurationVar(&o.ExternalMaxCall, "external-max-call", cli.EnvDuration("PELGUARD_EXTERNAL_MAX_CALL", 0), "with --external-ledger: the team consumer's worst-case Stripe call (client timeout × attempts); --min-idle must be at least twice it [PELGUARD_EXTERNAL_MAX_CALL]")
	fs.Var(&o.MeterStreams, "meter-stream", "meter-event stream to reap (the streams of pelguard-consumer meter-events), repeatable: name (with --group) or name=group;\n"+
		"its entries are decided against the meter ledger. Given alone, no charge stream is reaped unless --stream is given too")
	fs.DurationVar(&o.MeterSafeWindow, "meter-safe-window", 23*time.Hour, "with --meter-stream: the meter consumers' --safe-window (an event of unknown outcome is re-sent only this long after its first attempt)")
	fs.StringVar(&o.Name, "name", cli.Env("PELGUARD_REAPER_NAME", ""), "consumer name the reaper claims to; empty: reaper-host-pid-random [PELGUARD_REAPER_NAME]")
	fs.DurationVar(&o.MinIdle, "min-idle", cli.EnvDuration("PELGUARD_MIN_IDLE", reaper.DefaultMinIdle), "consider entries idle at least this long; also the XCLAIM fence.\nKeep it well above the consumers' heartbeat (lease/3) [PELGUARD_MIN_IDLE]")
	fs.DurationVar(&o.Interval, "interval", reaper.DefaultInterval, "time between passes (without --once)")
	fs.Int64Var(&o.PageSize, "page-size", reaper.DefaultPageSize, "XPENDING COUNT per page; one ledger query per page")
	fs.IntVar(&o.PageWorkers, "page-workers", reaper.DefaultPageWorkers, "pages decided at once")
	fs.Int64Var(&o.MaxDeliveries, "max-deliveries", reaper.DefaultMaxDeliveries, "dead-letter (and alert) an entry delivered this many times")
	fs.IntVar(&o.Workers, "workers", reaper.DefaultWorkers, "re-drives (Stripe calls) at once")
	fs.DurationVar(&o.ConsumerIdle, "consumer-idle", reaper.DefaultConsumerIdle, "remove consumers idle this long with nothing pending from the group, and forget the registered names gone from it and silent this long (0: never)")
	fs.DurationVar(&o.StreamRetention, "stream-retention", cli.EnvDuration("PELGUARD_STREAM_RETENTION", reaper.DefaultStreamRetention), "trim each stream to the oldest entry any consumer group on it still needs, keeping at least this long (replay, re-ingest after a ledger rollback, groups created at 0, readers without a group);\nat least the safe window + 1h05m (0: never trim; then no producer may trim with MAXLEN either) [PELGUARD_STREAM_RETENTION]")
	fs.Int64Var(&o.DeadLetterMax, "dead-letter-max", reaper.DefaultDeadLetterMax, "alert when a stream's dead letters (<stream>:dead, never trimmed) reach this many (0: never)")
	fs.DurationVar(&o.DeadLetterMaxAge, "dead-letter-max-age", reaper.DefaultDeadLetterMaxAge, "alert when a stream's oldest dead letter is this old (0: never)")
	fs.DurationVar(&o.Lease, "lease", consumer.DefaultLease, "ledger lease of a re-drive; renewed every lease/3")
	fs.BoolVar(&o.DryRun, "dry-run", false, "print every decision and change nothing (no Stripe key needed)")
	fs.BoolVar(&o.JSON, "json", false, "with --dry-run: print decisions as JSON lines instead of a table")
	fs.BoolVar(&o.Once, "once", false, "run one pass, wait for its re-drives, and exit")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long re-drives in flight may take to finish")
}

// Validate checks what the flags decide alone. reaper.Config.Validate
// checks the rest when run builds the reaper, before any connection.
func (o *RunOptions) Validate() error {
	if err := o.RoleFlags.CheckSchema(); err != nil {
		return err
	}
	if len(o.MeterStreams) > 0 {
		pairs, err := o.MeterStreams.Resolve(o.Group)
		if err != nil {
			return fmt.Errorf("--meter-stream: %w", err)
		}
		for _, p := range pairs {
			o.meterStreams = append(o.meterStreams, reaper.StreamGroup{Stream: p.Stream, Group: p.Group})
		}
		if o.MeterSafeWindow <= 0 || o.MeterSafeWindow >= stripeapi.MeterIdentifierWindow {
			return cli.Usagef("--meter-safe-window %s must be positive and below Stripe's %s identifier window", o.MeterSafeWindow, stripeapi.MeterIdentifierWindow)
		}
	}
	if len(o.Streams) > 0 || len(o.MeterStreams) == 0 {
		pairs, err := o.Streams.Resolve(o.Group)
		if err != nil {
			return err
		}
		for _, p := range pairs {
			o.streams = append(o.streams, reaper.StreamGroup{Stream: p.Stream, Group: p.Group})
		}
	}
	if o.StreamRetention < 0 || o.DeadLetterMax < 0 || o.DeadLetterMaxAge < 0 {
		return cli.Usagef("--stream-retention, --dead-letter-max and --dead-letter-max-age must not be negative (0 turns each off)")
	}
	if cfg := o.config(); o.StreamRetention > 0 && o.StreamRetention < reaper.MinStreamRetention(cfg) {
		return cli.Usagef("--stream-retention %s is below %s (the safe window plus the ledger repair's reach): raise it to at least %s, or 0 to turn trimming off",
			o.StreamRetention, reaper.MinStreamRetention(cfg), reaper.MinStreamRetention(cfg))
	}
	if err := o.Retries.Validate(); err != nil {
		return err
	}
	if err := o.validateExternal(); err != nil {
		return err
	}
	if o.JSON && !o.DryRun {
		return cli.Usagef("--json formats --dry-run's decisions; add --dry-run (live decisions are logged at debug)")
	}
	if o.ShutdownTimeout <= 0 {
		return cli.Usagef("--shutdown-timeout %s must be positive", o.ShutdownTimeout)
	}
	return o.RoleFlags.Validate(!o.DryRun) // a dry run needs no key
}

// validateExternal checks the --external-ledger flags before anything
// connects.
func (o *RunOptions) validateExternal() error {
	switch {
	case o.ExternalLedger == "" && o.ExternalMaxCall != 0:
		return cli.Usagef("--external-max-call applies only with --external-ledger")
	case o.ExternalLedger == "":
		return nil
	case o.ExternalMaxCall <= 0:
		return cli.Usagef("--external-ledger needs --external-max-call: the team consumer's worst-case Stripe call (its client timeout × attempts)")
	case o.MinIdle < 2*o.ExternalMaxCall:
		return cli.Usagef("--min-idle %s is below 2 × --external-max-call %s (= %s): the team's consumers have no heartbeat, so an entry idle less than that may still be inside its Stripe call; raise --min-idle to at least %s",
			o.MinIdle, o.ExternalMaxCall, 2*o.ExternalMaxCall, 2*o.ExternalMaxCall)
	case !o.DryRun && o.Stripe.Mode != "charges":
		return cli.Usagef("--external-ledger re-drives charge as the team's consumer does (Charge.create): add --stripe-mode charges (got %q)", o.Stripe.Mode)
	}
	return nil
}

func runCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o RunOptions
	fs := cli.NewFlagSet(prog, prog+" [run] [flags]", runDescription+"\n\n"+program().CommandList(), stderr)
	o.register(fs)
	if err := cli.ParseFlags(fs, args); err != nil {
		return cli.Fail(stderr, prog, err)
	}
	if err := o.Validate(); err != nil {
		return cli.Fail(stderr, prog, err)
	}
	return o.run(ctx, stdout, stderr)
}

// run builds everything without connecting, serves /healthz, waits for
// Redis and Postgres, checks the schema and the clock, then runs one pass
// (--once) or passes until ctx ends.
func (o *RunOptions) run(ctx context.Context, stdout, stderr io.Writer) int {
	conns, err := cli.MaxDBConns(o.MaxDBConns, o.Workers+o.PageWorkers*len(o.streams)+4)
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	spec := o.Role(role, role, o.Name, !o.DryRun, stripelimit.RoleRedrive, conns) // a dry run needs no key
	spec.Trace = role
	rp, err := cli.BuildRole(ctx, stderr, spec)
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	defer rp.Close()
	// What the reaper dead-letters alerts as the consumers' do: one alert
	// per stream and minute.
	dl := alerts.NewDeadLetterAggregator(rp.Notifier, time.Minute, nil)
	defer func() { _ = dl.Stop(context.Background()) }()
	logger, mon, pool, rdb, notifier, reg := rp.Logger, rp.Witness, rp.Pool, rp.Redis, rp.Notifier, rp.Registry
	var sc consumer.Stripe
	if rp.Stripe != nil {
		sc = rp.Stripe
	}

	cfg := o.config()
	cfg.Redis, cfg.DB, cfg.Stripe, cfg.Notifier, cfg.Logger, cfg.Witness = rdb, pool, sc, notifier, logger, mon
	if !o.DryRun {
		cfg.DeadLetters = dl
	}
	if ms, ok := sc.(consumer.MeterSender); ok && len(cfg.MeterStreams) > 0 {
		cfg.MeterStripe = ms
	}
	if c, ok := sc.(*stripeapi.Client); ok { // a dry run has no Stripe client: it detects and fences, never repairs
		mon.SetRepair(cli.LedgerRepair(pool, o.Schema, c, rdb, o.Namespace, cfg.Description, !o.ChargeMetadata, mon.Writer(), logger))
	}
	cfg.Metrics, cfg.ConsumerMetrics = reaper.NewMetrics(reg), consumer.NewMetrics(reg)
	pauses := rp.Pauses
	cfg.Paused = pauses.Paused
	for _, sg := range append(append([]reaper.StreamGroup{}, cfg.Streams...), cfg.MeterStreams...) {
		pauses.Func(sg.Stream, sg.Group) // exports the stream's pelguard_stream_paused, 0 until paused
	}
	var printer *decisionPrinter
	if o.DryRun {
		printer = newDecisionPrinter(stdout, o.JSON)
		cfg.OnDecision = printer.print
	}
	r, err := reaper.New(cfg)
	if err != nil {
		return cli.Fail(stderr, prog, cli.Usagef("%v", err))
	}
	ops, started, code, ok := cli.Startup{Prog: prog, MetricsAddr: o.MetricsAddr, Registry: reg, Redis: rdb, Pool: pool,
		Deps: rp.Deps, Wait: o.WaitForDeps, Schema: o.Schema,
		ClockLimit: o.Lease / 3, ClockWhat: "a third of --lease", Logger: logger, Rollback: mon,
		Agreement: o.agreement(mon.Writer()), Pauses: pauses}.Run(ctx, stderr)
	if !ok {
		return code
	}
	defer func() { _ = ops.Close(context.Background()) }()

	logger.Info("reaper starting", "name", r.Name(), "streams", fmt.Sprint(o.streams), "min_idle", o.MinIdle,
		"dry_run", o.DryRun, "once", o.Once)
	if o.Once {
		started.Open()
		sum, err := r.RunOnce(ctx)
		if printer != nil && !o.JSON {
			printer.summary(sum)
		}
		if err != nil {
			return cli.Fail(stderr, prog, err)
		}
		return cli.ExitOK
	}
	// Start detaches the reaper from ctx: only Stop ends it, so the
	// re-drives in flight at SIGTERM can finish.
	if err := r.Start(ctx); err != nil {
		return cli.Fail(stderr, prog, err)
	}
	started.Open()
	<-ctx.Done()
	logger.Info("stopping: finishing re-drives in flight", "timeout", o.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), o.ShutdownTimeout)
	defer cancel()
	if err := r.Stop(sctx); err != nil {
		logger.Error("stopped with re-drives unfinished; their entries stay pending and are safe to redeliver", "error", err)
		return cli.ExitError
	}
	logger.Info("stopped cleanly")
	return cli.ExitOK
}

// agreement is the reaper's: its charge and meter streams run with its
// --namespace. An external ledger's keys are the team's, not pelguard's:
// nothing to agree on. A dry run records nothing.
func (o *RunOptions) agreement(by string) cli.Agreement {
	a := cli.Agreement{Namespace: o.Namespace, Record: !o.DryRun, By: by}
	for _, sg := range o.meterStreams {
		a.Streams = append(a.Streams, streamfacts.Stream{Name: sg.Stream, Group: sg.Group, Kind: streamfacts.Usage})
	}
	if o.ExternalLedger == "" {
		for _, sg := range o.streams {
			a.Streams = append(a.Streams, streamfacts.Stream{Name: sg.Stream, Group: sg.Group, Kind: streamfacts.Charges})
		}
	}
	return a
}

// config is the reaper.Config the flags make, without the clients.
func (o *RunOptions) config() reaper.Config {
	// The flags' 0 means never; the library's 0 means its default.
	consumerIdle, retention, deadMax, deadAge := offIfZero(o.ConsumerIdle), offIfZero(o.StreamRetention), o.DeadLetterMax, offIfZero(o.DeadLetterMaxAge)
	if deadMax == 0 {
		deadMax = -1
	}
	return reaper.Config{
		Streams: o.streams, MeterStreams: o.meterStreams, MeterSafeWindow: o.MeterSafeWindow, Name: o.Name, MinIdle: o.MinIdle, Interval: o.Interval, PageSize: o.PageSize,
		PageWorkers: o.PageWorkers, MaxDeliveries: o.MaxDeliveries, Workers: o.Workers, ConsumerIdle: consumerIdle,
		StreamRetention: retention, DeadLetterMax: deadMax, DeadLetterMaxAge: deadAge,
		DryRun: o.DryRun, Namespace: o.Namespace, Lease: o.Lease, SafeKeyWindow: o.SafeKeyWindow, RequireCap: o.RequireCap,
		Retry:  o.Retries.Policy(),
		Rules:  o.Rules(),
		Schema: o.Schema, OmitChargeMetadata: !o.ChargeMetadata, Description: o.Description(), StoppedConsumers: strings.Split(o.StoppedConsumers, ","),
		ExternalLedger: o.ExternalLedger, ExternalMaxCall: o.ExternalMaxCall, ExternalInsert: o.ExternalInsert,
	}
}

func offIfZero(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
