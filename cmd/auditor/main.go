// Command auditor diffs Stripe charges against pelguard's ledger, records
// every discrepancy, alerts with the new ones and refunds duplicates when
// told to. See audit/README.md for the flags, exit codes and what to do
// about each finding kind.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/stripeapi"
)

const prog = "auditor"

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run is the whole program; tests call it directly.
func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := cli.SignalContext(context.Background())
	defer stop()
	cmd := "run"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "run":
		return runAudit(ctx, args, stdout, stderr)
	case "refund":
		return runRefund(ctx, args, stdout, stderr)
	case "findings":
		return runFindings(ctx, args, stdout, stderr)
	case "resolve", "dismiss":
		return runSetState(ctx, cmd, args, stdout, stderr)
	case "migrate":
		return cli.Migrate(ctx, prog, args, stdout, stderr)
	case "help":
		fmt.Fprint(stdout, usage)
		return cli.ExitOK
	}
	return cli.Fail(stderr, prog, cli.Usagef("unknown command %q: want run, refund, findings, resolve, dismiss or migrate", cmd))
}

const usage = `Usage: auditor [run] [flags]          audit a window (default: since the last checkpoint)
       auditor refund ID|--all [flags]   refund duplicate findings within caps
       auditor findings [flags]          list findings
       auditor resolve ID | dismiss ID   close a finding by hand
       auditor migrate up|down|status    manage the schema

Exit status: 0 clean, 1 open findings (or duplicates left unrefunded), 2 error.
Run 'auditor COMMAND --help' for the flags of each command.

` + permissions + "\n"

// permissions is what the auditor's Stripe key needs, shown in --help.
const permissions = `Stripe permissions (a restricted key, rk_live_…): Charges Read and PaymentIntents Read; Refunds
Write only for 'auditor refund' and --auto-refund (give plain runs a key without it). An
unrestricted sk_live_ key is refused unless --allow-unrestricted-key. A 403 names the missing
permission, fails the run (exit 2) and alerts Slack.`

// common holds what every subcommand shares.
type common struct {
	dbURL  string
	schema string
	log    cli.Logging
	json   bool
}

func (c *common) register(fs *flag.FlagSet) {
	cli.RegisterDatabase(fs, &c.dbURL)
	cli.RegisterSchema(fs, &c.schema)
	c.log.Register(fs)
	fs.BoolVar(&c.json, "json", false, "write JSON to stdout instead of a table")
}

// auditFlags are the flags that build an Auditor (run and refund).
type auditFlags struct {
	common
	stripe cli.Stripe
	slack  cli.Slack
	cfg    audit.Config
	// reg, when set (--schedule), receives the alerts' metrics; pool is
	// the ledger's pool once open has run (for /readyz).
	reg  prometheus.Registerer
	pool *pgxpool.Pool
}

func (f *auditFlags) register(fs *flag.FlagSet) {
	f.common.register(fs)
	f.stripe.Register(fs)
	f.slack.Register(fs)
	fs.IntVar(&f.cfg.MaxRefunds, "max-refunds", audit.DefaultMaxRefunds, "most refunds one refund run (or --auto-refund) makes")
	fs.Int64Var(&f.cfg.MaxCents, "max-cents", audit.DefaultMaxCents, "most minor units (cents) one refund run refunds in total")
}

// open connects to Postgres, validates the Stripe flags and builds the
// Auditor. The returned cleanup closes what was opened.
func (f *auditFlags) open(ctx context.Context, stderr io.Writer, notify bool) (*audit.Auditor, *slog.Logger, func(), error) {
	logger, err := f.log.Logger(stderr)
	if err != nil {
		return nil, nil, nil, err
	}
	// The shared helper checks the key (no unrestricted live key unless
	// allowed) and the mode; the auditor then builds its own client from
	// the same settings so it can count list pages.
	if _, err := f.stripe.Client(logger, nil); err != nil {
		return nil, nil, nil, err
	}
	pool, err := cli.OpenDB(ctx, prog, f.dbURL, f.schema, int32(max(4, f.cfg.Parallel+4)))
	if err != nil {
		return nil, nil, nil, err
	}
	f.pool = pool
	cleanup := pool.Close
	cfg := f.cfg
	cfg.DB, cfg.Schema, cfg.Logger = pool, f.schema, logger
	retries := stripeapi.RetriesFromFlag(f.stripe.MaxRetries)
	cfg.Stripe = stripeapi.Config{APIKey: f.stripe.APIKey, AllowUnrestrictedKey: f.stripe.AllowUnrestrictedKey, BaseURL: f.stripe.APIBase, Mode: stripeapi.Mode(f.stripe.Mode),
		MaxNetworkRetries: retries, Timeout: f.stripe.Timeout, RateLimit: f.stripe.RateLimit}
	if notify {
		n, err := f.slack.Notifier(logger, f.reg)
		if err != nil {
			pool.Close()
			return nil, nil, nil, err
		}
		cfg.Notifier = n
		cleanup = func() {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = n.Close(cctx)
			pool.Close()
		}
	}
	a, err := audit.New(cfg)
	if err != nil {
		cleanup()
		return nil, nil, nil, cli.Usagef("%v", err)
	}
	return a, logger, cleanup, nil
}

func runAudit(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet(prog, "auditor [run] [flags]",
		"Diffs the Stripe charges created in a window against the ledger and stores every finding\n"+
			"(duplicate_charge, orphan_charge, missing_charge, amount_mismatch, stuck_pending) once.\n"+
			"Exit status: 0 clean, 1 open findings, 2 error.\n\n"+permissions, stderr)
	var f auditFlags
	f.register(fs)
	var from, to, schedule, metricsAddr string
	var w audit.Window
	var shutdown time.Duration
	fs.StringVar(&from, "from", "", "start of the window (RFC 3339 or YYYY-MM-DD); default: the last checkpoint minus --overlap")
	fs.StringVar(&to, "to", "", "end of the window, exclusive; default: now minus --settle-delay")
	fs.StringVar(&w.Period, "period", "", "audit one billing period (YYYY-MM): its month plus 45 days, findings of that period only")
	fs.BoolVar(&f.cfg.Legacy, "legacy", false, "also audit charges without the pelguard marker (the old consumer's), reporting duplicates only")
	fs.StringVar(&f.cfg.LegacyPattern, "legacy-pattern", audit.DefaultLegacyPattern, "regexp taking a legacy charge's period from its description (group 1)")
	fs.IntVar(&f.cfg.Parallel, "parallel", audit.DefaultParallel, "sub-windows listed at once (with --stripe-rate to stay under Stripe's limit)")
	fs.DurationVar(&f.cfg.SettleDelay, "settle-delay", audit.DefaultSettleDelay, "stay this far behind now, so charges being recorded are not orphans")
	fs.DurationVar(&f.cfg.Overlap, "overlap", audit.DefaultOverlap, "reach this far back before the last checkpoint")
	fs.DurationVar(&f.cfg.InitialLookback, "initial-lookback", audit.DefaultInitialLookback, "window of the very first run")
	fs.DurationVar(&f.cfg.StuckAfter, "stuck-after", audit.DefaultStuckAfter, "a pending row without a live lease this long is stuck_pending")
	fs.DurationVar(&f.cfg.LockWait, "lock-wait", 10*time.Minute, "wait this long for a run in progress (scheduled runs skip at once)")
	fs.StringVar(&schedule, "schedule", "", "run on this cron schedule (e.g. '*/30 * * * *' or '@hourly') until SIGTERM")
	fs.BoolVar(&f.cfg.AutoRefund, "auto-refund", false, "refund open duplicates after each run, within --max-refunds and --max-cents")
	fs.StringVar(&metricsAddr, "metrics-addr", cli.Env("PELGUARD_AUDITOR_METRICS_ADDR", ""), "serve /metrics, /healthz, /readyz here with --schedule (e.g. 127.0.0.1:9466) [PELGUARD_AUDITOR_METRICS_ADDR]")
	fs.DurationVar(&shutdown, "shutdown-timeout", 10*time.Minute, "on SIGTERM, wait this long for a run in progress")
	if err := cli.Parse(fs, args); err != nil {
		return cli.Fail(stderr, prog, err)
	}
	if fs.NArg() > 0 {
		return cli.Fail(stderr, prog, cli.Usagef("unexpected argument %q", fs.Arg(0)))
	}
	var err error
	if w.From, err = parseTime("--from", from); err != nil {
		return cli.Fail(stderr, prog, err)
	}
	if w.To, err = parseTime("--to", to); err != nil {
		return cli.Fail(stderr, prog, err)
	}
	if schedule != "" && w.Manual() {
		return cli.Fail(stderr, prog, cli.Usagef("--schedule audits from the checkpoint: it cannot take --from, --to or --period"))
	}
	if schedule != "" {
		f.cfg.LockWait = 0
	}
	if isTerminal(stderr) && schedule == "" {
		f.cfg.Progress = stderr
	}
	var reg *prometheus.Registry
	if schedule != "" {
		reg = cli.NewRegistry()
		f.reg = reg
	}
	a, logger, cleanup, err := f.open(ctx, stderr, true)
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	defer cleanup()

	if schedule != "" {
		return runScheduled(ctx, a, logger, schedule, metricsAddr, shutdown, reg, f.pool, stderr)
	}
	rep, err := a.Run(ctx, w)
	switch {
	case errors.Is(err, audit.ErrEmptyWindow):
		fmt.Fprintf(stderr, "%s: nothing to audit: %v\n", prog, err)
		return cli.ExitOK
	case errors.Is(err, audit.ErrLocked):
		return cli.Fail(stderr, prog, fmt.Errorf("%w (waited --lock-wait %s)", err, f.cfg.LockWait))
	case err != nil:
		return cli.Fail(stderr, prog, err)
	}
	if err := write(stdout, f.json, rep, rep.WriteTable); err != nil {
		return cli.Fail(stderr, prog, err)
	}
	return rep.ExitCode()
}

func runScheduled(ctx context.Context, a *audit.Auditor, logger *slog.Logger, spec, metricsAddr string, shutdown time.Duration,
	reg *prometheus.Registry, pool *pgxpool.Pool, stderr io.Writer) int {
	metrics := audit.NewMetrics(reg)
	sched, err := a.NewScheduler(spec, metrics.Observe)
	if err != nil {
		return cli.Fail(stderr, prog, cli.Usagef("--schedule: %v", err))
	}
	// The auditor needs Postgres only (it reads Stripe, not Redis).
	ops, err := cli.ServeOps(metricsAddr, reg, []cli.Check{{Name: "postgres", Fn: pool.Ping}}, logger)
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	// Runs get a context SIGTERM does not cancel: Stop waits for the run
	// in progress, up to --shutdown-timeout.
	if err := sched.Start(context.WithoutCancel(ctx)); err != nil {
		return cli.Fail(stderr, prog, err)
	}
	<-ctx.Done()
	logger.Info("stopping: waiting for a run in progress", slog.Duration("timeout", shutdown))
	sctx, cancel := context.WithTimeout(context.Background(), shutdown)
	defer cancel()
	err = sched.Stop(sctx)
	_ = ops.Close(sctx)
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	return cli.ExitOK
}

func runRefund(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet(prog+" refund", "auditor refund ID|--all [flags]",
		"Refunds open duplicate_charge findings (reason duplicate, one idempotency key per charge,\n"+
			"never the canonical charge) and records each refund id. Stops at the first refund that\n"+
			"would pass --max-refunds or --max-cents. Exit 1 when duplicates remain open.\n\n"+permissions, stderr)
	var f auditFlags
	f.register(fs)
	var all bool
	var opts audit.RefundOptions
	fs.BoolVar(&all, "all", false, "refund every open duplicate, oldest first")
	fs.BoolVar(&opts.DryRun, "dry-run", false, "show what would be refunded; change nothing")
	fs.DurationVar(&opts.LockWait, "lock-wait", time.Minute, "wait this long for another refund run")
	id, rest, err := leadingID(args)
	if err != nil {
		return cli.Fail(stderr, prog+" refund", err)
	}
	if err := cli.Parse(fs, rest); err != nil {
		return cli.Fail(stderr, prog+" refund", err)
	}
	if id == 0 && fs.NArg() > 0 {
		if id, _, err = leadingID(fs.Args()); err != nil {
			return cli.Fail(stderr, prog+" refund", err)
		}
	}
	if (id == 0) == !all {
		return cli.Fail(stderr, prog+" refund", cli.Usagef("give one finding ID or --all (not both)"))
	}
	if f.cfg.MaxRefunds <= 0 || f.cfg.MaxCents <= 0 {
		return cli.Fail(stderr, prog+" refund", cli.Usagef("--max-refunds and --max-cents must be positive"))
	}
	opts.FindingID, opts.MaxRefunds, opts.MaxCents = id, f.cfg.MaxRefunds, f.cfg.MaxCents
	a, _, cleanup, err := f.open(ctx, stderr, false)
	if err != nil {
		return cli.Fail(stderr, prog+" refund", err)
	}
	defer cleanup()
	rr, err := a.Refund(ctx, opts)
	if werr := write(stdout, f.json, rr, rr.WriteTable); werr != nil && err == nil {
		err = werr
	}
	if err != nil {
		return cli.Fail(stderr, prog+" refund", err)
	}
	if rr.StoppedBy != "" || len(rr.Skipped) > 0 {
		return cli.ExitFindings
	}
	return cli.ExitOK
}

func runFindings(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet(prog+" findings", "auditor findings [flags]", "Lists findings, newest first.", stderr)
	var c common
	c.register(fs)
	var flt audit.Filter
	var kind, state string
	fs.StringVar(&kind, "kind", "", "only this kind: duplicate_charge, orphan_charge, missing_charge, amount_mismatch, stuck_pending")
	fs.StringVar(&state, "state", "", "only this state: open, refunded, resolved, dismissed")
	fs.StringVar(&flt.Period, "period", "", "only this billing period")
	fs.IntVar(&flt.Limit, "limit", 1000, "at most this many")
	if err := cli.Parse(fs, args); err != nil {
		return cli.Fail(stderr, prog+" findings", err)
	}
	flt.Kind, flt.State = audit.Kind(kind), audit.State(state)
	if err := checkFilter(flt); err != nil {
		return cli.Fail(stderr, prog+" findings", err)
	}
	store, cleanup, err := c.store(ctx, stderr)
	if err != nil {
		return cli.Fail(stderr, prog+" findings", err)
	}
	defer cleanup()
	fsl, err := store.Findings(ctx, flt)
	if err != nil {
		return cli.Fail(stderr, prog+" findings", err)
	}
	if err := write(stdout, c.json, fsl, func(w io.Writer) error { return audit.WriteFindings(w, fsl) }); err != nil {
		return cli.Fail(stderr, prog+" findings", err)
	}
	return cli.ExitOK
}

func runSetState(ctx context.Context, verb string, args []string, stdout, stderr io.Writer) int {
	name := prog + " " + verb
	fs := cli.NewFlagSet(name, "auditor "+verb+" ID [flags]",
		"resolve: the finding was handled by hand (open or dismissed → resolved).\n"+
			"dismiss: the finding is not a problem (open → dismissed). Reruns never reopen either.", stderr)
	var c common
	c.register(fs)
	id, rest, err := leadingID(args)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	if err := cli.Parse(fs, rest); err != nil {
		return cli.Fail(stderr, name, err)
	}
	if id == 0 && fs.NArg() > 0 {
		if id, _, err = leadingID(fs.Args()); err != nil {
			return cli.Fail(stderr, name, err)
		}
	}
	if id == 0 {
		return cli.Fail(stderr, name, cli.Usagef("give the finding ID"))
	}
	store, cleanup, err := c.store(ctx, stderr)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	defer cleanup()
	change := store.Resolve
	if verb == "dismiss" {
		change = store.Dismiss
	}
	fd, err := change(ctx, id)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	if err := write(stdout, c.json, fd, func(w io.Writer) error { return audit.WriteFindings(w, []audit.Finding{fd}) }); err != nil {
		return cli.Fail(stderr, name, err)
	}
	return cli.ExitOK
}

func (c *common) store(ctx context.Context, stderr io.Writer) (*audit.Store, func(), error) {
	if _, err := c.log.Logger(stderr); err != nil {
		return nil, nil, err
	}
	pool, err := cli.OpenDB(ctx, prog, c.dbURL, c.schema, 2)
	if err != nil {
		return nil, nil, err
	}
	return audit.NewStore(pool, c.schema), pool.Close, nil
}

func checkFilter(f audit.Filter) error {
	if f.Kind != "" {
		ok := false
		for _, k := range audit.Kinds {
			ok = ok || k == f.Kind
		}
		if !ok {
			return cli.Usagef("--kind %q: want one of %v", f.Kind, audit.Kinds)
		}
	}
	switch f.State {
	case "", audit.StateOpen, audit.StateRefunded, audit.StateResolved, audit.StateDismissed:
		return nil
	}
	return cli.Usagef("--state %q: want open, refunded, resolved or dismissed", f.State)
}

// leadingID takes a finding id given before the flags.
func leadingID(args []string) (int64, []string, error) {
	if len(args) == 0 || (len(args[0]) > 0 && args[0][0] == '-') {
		return 0, args, nil
	}
	id, err := strconv.ParseInt(args[0], 10, 64)
	if err != nil || id <= 0 {
		return 0, nil, cli.Usagef("%q is not a finding ID", args[0])
	}
	return id, args[1:], nil
}

func parseTime(name, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, cli.Usagef("%s %q: want RFC 3339 (2026-11-30T12:00:00Z) or YYYY-MM-DD", name, s)
}

func write(w io.Writer, asJSON bool, v any, table func(io.Writer) error) error {
	if asJSON {
		return audit.WriteJSON(w, v)
	}
	return table(w)
}

// isTerminal reports whether w is a character device (a terminal), where a
// progress line helps; logs and pipes get structured lines only.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
