package auditorcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/internal/cli"
)

const runDescription = `Diffs the Stripe charges created in a window against the ledger and stores every finding
(duplicate_charge, orphan_charge, missing_charge, amount_mismatch, disputed, ambiguous_legacy,
stuck_pending) once. Only duplicate_charge is ever refunded: an orphan_charge is usually the
customer's only charge for the period (pelguard's charge for a key whose ledger row is missing;
after a ledger loss, always): record it (a redelivery, 'pelguard-consumer import --from-stripe', or by
hand), then 'pelguard-auditor resolve ID'. At start it waits up to --wait-for-deps for Postgres.`

// RunOptions are the flags of `auditor run`.
type RunOptions struct {
	auditOptions
	From, To string // RFC 3339 or YYYY-MM-DD; parsed by Validate
	// SettleDelay is the flag's value: 0 means none (Validate maps it to
	// audit.NoSettleDelay, since the Config's zero takes the default).
	SettleDelay     time.Duration
	Period          string
	Schedule        string // cron spec: run until SIGTERM
	MetricsAddr     string
	ShutdownTimeout time.Duration
	WaitForDeps     time.Duration

	window audit.Window // set by Validate
}

func (o *RunOptions) register(fs *flag.FlagSet) {
	o.auditOptions.register(fs)
	c := &o.Config
	fs.StringVar(&o.From, "from", "", "start of the window (RFC 3339 or YYYY-MM-DD); default: the last checkpoint minus --overlap")
	fs.StringVar(&o.To, "to", "", "end of the window, exclusive; default: now minus --settle-delay")
	fs.StringVar(&o.Period, "period", "", "audit one billing period (YYYY-MM): its month plus 45 days, findings of that period only")
	fs.BoolVar(&c.Legacy, "legacy", false, "also audit charges without the pelguard marker (the old consumer's), reporting duplicates only")
	fs.BoolVar(&c.OneCustomerPerStripeCustomer, "one-customer-per-stripe-customer", cli.EnvBool("PELGUARD_ONE_CUSTOMER_PER_STRIPE_CUSTOMER", false),
		"with --legacy: each Stripe customer pays for exactly one of the team's customers, so two unmarked charges of one amount on a Stripe customer\n"+
			"pelguard knows nothing of are a duplicate (refundable); without it they are ambiguous_legacy, for a person [PELGUARD_ONE_CUSTOMER_PER_STRIPE_CUSTOMER]")
	fs.StringVar(&c.ExternalLedger, "external-ledger", "", "with --legacy: a team's own table (schema.table, e.g. billing_records) whose charge for a customer and period is canonical and never refunded (reaper --external-ledger deployments); only read")
	fs.StringVar(&c.LegacyPattern, "legacy-pattern", audit.DefaultLegacyPattern, "regexp taking a legacy charge's period from its description (group 1)")
	fs.IntVar(&c.Parallel, "parallel", audit.DefaultParallel, "sub-windows listed at once (with --stripe-rate to stay under Stripe's limit)")
	fs.DurationVar(&o.SettleDelay, "settle-delay", audit.DefaultSettleDelay,
		"stay this far behind now, so charges being recorded are not orphans; 0: none (audit up to now)")
	fs.DurationVar(&c.Overlap, "overlap", audit.DefaultOverlap, "reach this far back before the last checkpoint")
	fs.DurationVar(&c.InitialLookback, "initial-lookback", audit.DefaultInitialLookback, "window of the very first run")
	fs.DurationVar(&c.StuckAfter, "stuck-after", audit.DefaultStuckAfter, "a pending row without a live lease this long is stuck_pending")
	fs.DurationVar(&c.StuckProcessingAfter, "stuck-processing-after", audit.DefaultStuckProcessingAfter,
		"a processing row (a bank debit in motion) unsettled this long is stuck_pending (SEPA debits take up to 14 business days)")
	fs.DurationVar(&c.LockWait, "lock-wait", 10*time.Minute, "wait this long for a run in progress (scheduled runs skip at once)")
	fs.StringVar(&o.Schedule, "schedule", "", "run on this cron schedule (e.g. '*/30 * * * *' or '@hourly') until SIGTERM")
	fs.BoolVar(&c.Usage.Enabled, "usage", cli.EnvBool("PELGUARD_AUDITOR_USAGE", false),
		"with --schedule: reconcile Stripe's meter totals with the meter ledger after each run (see 'usage --help') [PELGUARD_AUDITOR_USAGE]")
	registerUsage(fs, &c.Usage)
	fs.BoolVar(&c.AutoRefund, "auto-refund", false, "refund open duplicates after each run, within --max-refunds and --max-cents and the rolling --max-refunds-24h and --max-cents-24h")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", cli.Env("PELGUARD_AUDITOR_METRICS_ADDR", ""), "serve /metrics, /healthz, /readyz here with --schedule (e.g. 127.0.0.1:9466) [PELGUARD_AUDITOR_METRICS_ADDR]")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", 10*time.Minute, "on SIGTERM, wait this long for a run in progress")
	cli.RegisterWait(fs, &o.WaitForDeps)
}

// Validate checks the flags and parses the window. audit.New checks the
// rest of the Config when run builds the Auditor, before any connection.
func (o *RunOptions) Validate() error {
	var err error
	if err := cli.MonthPeriod("period", o.Period, "for a week, a quarter or a day give --from and --to"); err != nil {
		return err
	}
	o.window = audit.Window{Period: o.Period}
	if o.window.From, err = parseTime("--from", o.From); err != nil {
		return err
	}
	if o.window.To, err = parseTime("--to", o.To); err != nil {
		return err
	}
	switch {
	case o.SettleDelay < 0:
		return cli.Usagef("--settle-delay %s: want a duration of 0 or more (0: audit up to now; default %s)", o.SettleDelay, audit.DefaultSettleDelay)
	case o.SettleDelay == 0:
		o.Config.SettleDelay = audit.NoSettleDelay
	default:
		o.Config.SettleDelay = o.SettleDelay
	}
	if o.Config.Usage.Enabled && o.Schedule == "" {
		return cli.Usagef("--usage reconciles meters after each scheduled run: give --schedule too, or run 'pelguard-auditor usage' once")
	}
	if o.Schedule != "" && o.window.Manual() {
		return cli.Usagef("--schedule audits from the checkpoint: it cannot take --from, --to or --period")
	}
	if err := cli.ValidateWait(o.WaitForDeps); err != nil {
		return err
	}
	return o.validate()
}

func runCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o RunOptions
	fs := cli.NewFlagSet(prog, prog+" [run] [flags]",
		runDescription+"\n"+exitStatus+"\n\n"+permissions+"\n\n"+program().CommandList(), stderr)
	o.register(fs)
	if err := cli.ParseFlags(fs, args); err != nil {
		return cli.Fail(stderr, prog, err)
	}
	if err := o.Validate(); err != nil {
		return cli.Fail(stderr, prog, err)
	}
	stopTracing, err := cli.Tracing(ctx, role)
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	defer stopTracing()
	if o.Schedule != "" {
		return o.runScheduled(ctx, stderr)
	}
	return o.runOnce(ctx, stdout, stderr)
}

// runOnce audits one window and prints the report.
func (o *RunOptions) runOnce(ctx context.Context, stdout, stderr io.Writer) int {
	if isTerminal(stderr) {
		o.Config.Progress = stderr
	}
	a, err := o.build(stderr, nil, true)
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	defer a.close()
	if err := a.connect(ctx, o.WaitForDeps); err != nil {
		return cli.Fail(stderr, prog, err)
	}
	rep, err := a.Run(ctx, o.window)
	switch {
	case errors.Is(err, audit.ErrEmptyWindow):
		fmt.Fprintf(stderr, "%s: nothing to audit: %v\n", prog, err)
		return cli.ExitOK
	case errors.Is(err, audit.ErrLocked):
		return cli.Fail(stderr, prog, fmt.Errorf("%w (waited --lock-wait %s)", err, o.Config.LockWait))
	case err != nil:
		return cli.Fail(stderr, prog, err)
	}
	if err := write(stdout, o.JSON, rep, rep.WriteTable); err != nil {
		return cli.Fail(stderr, prog, err)
	}
	return rep.ExitCode()
}

// runScheduled audits on the cron schedule until ctx ends, serving
// /metrics, /healthz and /readyz (Postgres only: the auditor reads Stripe,
// not Redis).
func (o *RunOptions) runScheduled(ctx context.Context, stderr io.Writer) int {
	o.Config.LockWait = 0 // a scheduled run skips when another holds the lock
	reg := cli.NewRegistry(role)
	a, err := o.build(stderr, reg, true)
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	defer a.close()
	metrics := audit.NewMetrics(reg)
	sched, err := a.NewScheduler(o.Schedule, metrics.Observe)
	if err != nil {
		return cli.Fail(stderr, prog, cli.Usagef("--schedule: %v", err))
	}
	sched.OnUsage(metrics.ObserveUsage)
	var started cli.Gate
	ops, err := cli.ServeOps(o.MetricsAddr, reg, []cli.Check{started.Check(), {Name: "postgres", Fn: a.pool.Ping}}, a.logger)
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	defer func() { _ = ops.Close(context.Background()) }()
	if err := a.connect(ctx, o.WaitForDeps); err != nil {
		if ctx.Err() != nil {
			a.logger.Info("stopped while waiting for Postgres")
			return cli.ExitOK
		}
		return cli.Fail(stderr, prog, err)
	}
	cli.ReportDurability(ctx, a.pool, a.logger, reg)
	return serveSchedule(ctx, sched, &started, o.ShutdownTimeout, a.logger, stderr)
}

func serveSchedule(ctx context.Context, sched *audit.Scheduler, started *cli.Gate, shutdown time.Duration, logger *slog.Logger,
	stderr io.Writer) int {
	// Runs get a context SIGTERM does not cancel: Stop waits for the run
	// in progress, up to --shutdown-timeout.
	if err := sched.Start(context.WithoutCancel(ctx)); err != nil {
		return cli.Fail(stderr, prog, err)
	}
	started.Open()
	<-ctx.Done()
	logger.Info("stopping: waiting for a run in progress", slog.Duration("timeout", shutdown))
	sctx, cancel := context.WithTimeout(context.Background(), shutdown)
	defer cancel()
	if err := sched.Stop(sctx); err != nil {
		return cli.Fail(stderr, prog, err)
	}
	return cli.ExitOK
}
