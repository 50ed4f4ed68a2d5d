package consumercli

import (
	"context"
	"flag"
	"io"
	"time"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/stripelimit"
)

const runDescription = `Reads billing events from a Redis Stream consumer group and charges each customer once per
billing period through Stripe. Every event is checked against and recorded in the Postgres
ledger (billing_records) before it is acked; a heartbeat keeps slow Stripe calls from being
reclaimed; bad events go to <stream>:dead with the reason. Several --stream values run one
consumer per stream in this process (e.g. hash-tagged streams on a Redis Cluster).

Environment: REDIS_URL, DATABASE_URL, STRIPE_API_KEY, STRIPE_API_BASE, SLACK_WEBHOOK_URL,
SLACK_BOT_TOKEN, SLACK_CHANNEL. At start it waits up to --wait-for-deps for Redis and Postgres.
On SIGTERM it stops reading, finishes events in flight and exits 0 within --shutdown-timeout.
Exit status: 0 stopped cleanly, 2 bad flags or configuration (or events left unfinished at
stop), 3 Redis or Postgres still unreachable after --wait-for-deps.

Stripe permissions (a restricted key, rk_live_…): PaymentIntents Write (Charges Write with
--stripe-mode charges), Charges Read, PaymentIntents Read (the lookup past --safe-key-window),
Customers Read (payment_intents mode on live Stripe: the default payment method). An unrestricted
sk_live_ key is refused unless --allow-unrestricted-key. A 403 names the missing permission: the
event is dead-lettered (stripe_key_error; its ledger row stays pending: replay it once the key is
fixed) and Slack is told once per permission.

Money in motion: a bank debit that ends the create call "processing" is recorded processing and
polled every --follow-up-every (with backoff) until Stripe says it succeeded or failed; a soft
decline is retried --decline-retries times, --decline-retry-after apart, each under a new
attempt's key; a charge that needs the customer (authentication, a payment method) is recorded
action_required, alerted and dead-lettered: replay it once the customer has fixed it.`

// RunOptions are the flags of `consumer run`.
type RunOptions struct {
	cli.RoleFlags
	cli.Charging
	Name                    string
	Count                   int64
	Block                   time.Duration
	Workers                 int
	Lease                   time.Duration
	ShutdownTimeout         time.Duration
	DeadLetterAlertInterval time.Duration
	FollowUpEvery           time.Duration

	streams []cli.StreamGroup // resolved by Validate
}

func (o *RunOptions) register(fs *flag.FlagSet) {
	o.RoleFlags.Register(fs, cli.ConsumerMetrics.Verb("consume (one consumer per stream, each with --workers)"))
	o.Charging.Register(fs, "give each environment its own")
	fs.StringVar(&o.Name, "name", cli.Env("PELGUARD_CONSUMER_NAME", ""), "pinned consumer name (e.g. a StatefulSet pod name): drains its own pending entries after a restart;\nempty: unique per process (host-pid-random) [PELGUARD_CONSUMER_NAME]")
	fs.Int64Var(&o.Count, "count", consumer.DefaultCount, "XREADGROUP COUNT (acks are always per event)")
	fs.DurationVar(&o.Block, "block", consumer.DefaultBlock, "XREADGROUP BLOCK")
	fs.IntVar(&o.Workers, "workers", consumer.DefaultWorkers, "events handled at once")
	fs.DurationVar(&o.Lease, "lease", consumer.DefaultLease, "ledger lease; the heartbeat renews it every lease/3")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long events in flight may take to finish")
	fs.DurationVar(&o.DeadLetterAlertInterval, "dead-letter-alert-interval", time.Minute, "dead-letter alerts are aggregated over this interval")
	fs.DurationVar(&o.FollowUpEvery, "follow-up-every", consumer.DefaultFollowUpEvery,
		"how often to poll processing bank debits and charge due retries from the ledger (0: off; some consumer must run it)")
}

// Validate checks what the flags decide alone, before anything is built.
// consumer.Config.Validate checks the consumer's own settings when run
// builds the consumers: also before any connection is tried, so a wrong
// flag exits 2 at once, never after --wait-for-deps.
func (o *RunOptions) Validate() error {
	if err := o.RoleFlags.CheckSchema(); err != nil {
		return err
	}
	streams, err := o.Streams.Resolve(o.Group)
	if err != nil {
		return err
	}
	o.streams = streams
	if err := o.Retries.Validate(); err != nil {
		return err
	}
	if o.FollowUpEvery < 0 {
		return cli.Usagef("--follow-up-every %s must not be negative (0 turns it off)", o.FollowUpEvery)
	}
	if o.ShutdownTimeout <= 0 {
		return cli.Usagef("--shutdown-timeout %s must be positive", o.ShutdownTimeout)
	}
	return o.RoleFlags.Validate(true)
}

func runCmd(ctx context.Context, args []string, _, stderr io.Writer) int {
	var o RunOptions
	fs := cli.NewFlagSet(prog, prog+" [run] [flags]", runDescription+"\n\n"+program().CommandList(), stderr)
	o.register(fs)
	if err := cli.ParseFlags(fs, args); err != nil {
		return cli.Fail(stderr, prog, err)
	}
	if err := o.Validate(); err != nil {
		return cli.Fail(stderr, prog, err)
	}
	return o.run(ctx, stderr)
}

// run builds everything without connecting (a configuration error exits 2
// here), serves /healthz (so a liveness probe sees the process up while it
// waits), waits for Redis and Postgres, checks the schema and the clock,
// and consumes until ctx ends.
func (o *RunOptions) run(ctx context.Context, stderr io.Writer) int {
	conns, err := cli.MaxDBConns(o.MaxDBConns, len(o.streams)*o.Workers*2+4)
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	spec := o.Role(role, role, o.Name, true, stripelimit.RoleBilling, conns)
	spec.Trace = role
	rp, err := cli.BuildRole(ctx, stderr, spec)
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	defer rp.Close()
	logger, mon, pool, rdb, sc, notifier, reg, pauses := rp.Logger, rp.Witness, rp.Pool, rp.Redis, rp.Stripe, rp.Notifier, rp.Registry, rp.Pauses
	metrics := consumer.NewMetrics(reg)
	dl := alerts.NewDeadLetterAggregator(notifier, o.DeadLetterAlertInterval, nil)
	defer func() { _ = dl.Stop(context.Background()) }()
	base := o.config()
	base.Redis, base.DB, base.Stripe, base.Witness = rdb, pool, sc, mon
	mon.SetRepair(cli.LedgerRepair(pool, o.Schema, sc, rdb, o.Namespace, base.Description, !o.ChargeMetadata, mon.Writer(), logger))
	base.Notifier, base.DeadLetters, base.Metrics, base.Logger = notifier, dl, metrics, logger
	cs := make([]*consumer.Consumer, len(o.streams))
	for i, sg := range o.streams {
		cfg := base
		cfg.Stream, cfg.Group, cfg.Paused = sg.Stream, sg.Group, pauses.Func(sg.Stream, sg.Group)
		if i > 0 {
			// The ledger follow-up is ledger-wide, not per stream: one
			// loop per process (the first consumer's) does it all.
			cfg.FollowUpEvery = -1
		}
		if cs[i], err = consumer.New(cfg); err != nil {
			return cli.Fail(stderr, prog, cli.Usagef("%v", err))
		}
	}
	ops, started, code, ok := cli.Startup{Prog: prog, MetricsAddr: o.MetricsAddr, Registry: reg, Redis: rdb, Pool: pool,
		Deps: rp.Deps, Wait: o.WaitForDeps, Schema: o.Schema,
		ClockLimit: o.Lease / 3, ClockWhat: "a third of --lease", Logger: logger, Rollback: mon,
		Agreement: cli.Agreement{Namespace: o.Namespace, Streams: cli.ChargeStreams(o.streams), Record: true, By: mon.Writer()}, Pauses: pauses}.Run(ctx, stderr)
	if !ok {
		return code
	}
	defer func() { _ = ops.Close(context.Background()) }()
	s := supervisor{consumers: cs, streams: o.streams, shutdownTimeout: o.ShutdownTimeout, logger: logger,
		workers: o.Workers, count: o.Count}
	if err := s.start(ctx); err != nil {
		return cli.Fail(stderr, prog, err)
	}
	started.Open()
	s.wait(ctx)
	if !s.stop() {
		return cli.ExitError
	}
	logger.Info("stopped cleanly")
	return cli.ExitOK
}

// config is the consumer.Config the flags make, without the clients and
// the stream, which run adds.
func (o *RunOptions) config() consumer.Config {
	return consumer.Config{
		Name: o.Name, Namespace: o.Namespace, Schema: o.Schema, OmitChargeMetadata: !o.ChargeMetadata,
		Description: o.Description(),
		Count:       o.Count, Block: o.Block, Workers: o.Workers, Lease: o.Lease, SafeKeyWindow: o.SafeKeyWindow,
		RequireCap: o.RequireCap, Rules: o.Rules(),
		Retry:         o.Retries.Policy(),
		FollowUpEvery: followUpEvery(o.FollowUpEvery),
	}
}

// followUpEvery maps the flag's 0 ("off") to the Config's negative.
func followUpEvery(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

func closeNotifier(n alerts.Notifier) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = n.Close(ctx)
}
