package auditorcli

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/rollback"
	"github.com/pelguard/pelguard/stripelimit"
)

// commonOptions are the flags every command shares.
type commonOptions struct {
	DatabaseURL string
	Schema      string
	Log         cli.Logging
	JSON        bool
}

func (o *commonOptions) register(fs *flag.FlagSet) {
	cli.RegisterDatabase(fs, &o.DatabaseURL)
	cli.RegisterSchema(fs, &o.Schema)
	o.Log.Register(fs)
	fs.BoolVar(&o.JSON, "json", false, "write JSON to stdout instead of a table")
}

// store opens the findings store (one try at Postgres).
func (o *commonOptions) store(ctx context.Context, stderr io.Writer) (*audit.Store, func(), error) {
	if _, err := o.Log.Logger(stderr); err != nil {
		return nil, nil, err
	}
	pool, err := cli.OpenDB(ctx, prog, o.DatabaseURL, o.Schema, 2)
	if err != nil {
		return nil, nil, err
	}
	return audit.NewStore(pool, o.Schema), pool.Close, nil
}

// auditOptions are the flags that build an Auditor (run and refund).
type auditOptions struct {
	commonOptions
	// RedisURL is optional: with it the auditor's Stripe reads share the
	// account's rate with the consumers and the reaper (last, above its
	// floor); without it they keep to --stripe-fallback-rate alone.
	RedisURL string
	Stripe   cli.Stripe
	Slack    cli.Slack
	// Config holds the flags that map onto audit.Config directly; build
	// adds the pool, the logger, the Stripe settings and the notifier.
	Config audit.Config
}

func (o *auditOptions) register(fs *flag.FlagSet) {
	o.commonOptions.register(fs)
	fs.StringVar(&o.RedisURL, "redis-url", cli.Env("REDIS_URL", ""),
		"optional: the fleet's Redis, to share --stripe-rate with the consumers and the reaper (empty: this process alone at --stripe-fallback-rate; Redis down: the same, with a warning) [REDIS_URL]")
	cli.ZeroMeans(fs, "redis-url") // empty: this process alone
	o.Stripe.Register(fs)
	o.Slack.Register(fs)
	fs.IntVar(&o.Config.MaxRefunds, "max-refunds", audit.DefaultMaxRefunds, "most refunds one refund run (or --auto-refund) makes")
	fs.Int64Var(&o.Config.MaxCents, "max-cents", audit.DefaultMaxCents, "most minor units (cents) one refund run refunds in total")
	fs.IntVar(&o.Config.MaxRefunds24h, "max-refunds-24h", audit.DefaultMaxRefunds24h,
		"most refunds pelguard makes in any 24 h, over every run and process (persisted in refund_ledger)")
	fs.Int64Var(&o.Config.MaxCents24h, "max-cents-24h", audit.DefaultMaxCents24h,
		"most minor units (cents) pelguard refunds in any 24 h, over every run and process (persisted in refund_ledger)")
	fs.DurationVar(&o.Config.LockLease, "lock-lease", audit.DefaultLockLease,
		"the run lock's lease, renewed every third of it while the run works: a run that was killed keeps the next one waiting this long at most (at least 3s)")
}

// validate checks the flags the Auditor's commands share.
func (o *auditOptions) validate() error {
	if err := o.Log.Validate(); err != nil {
		return err
	}
	if o.Config.LockLease != 0 && o.Config.LockLease < audit.MinLockLease {
		return cli.Usagef("--lock-lease %s: want at least %s (default %s)", o.Config.LockLease, audit.MinLockLease, audit.DefaultLockLease)
	}
	return o.Stripe.Validate()
}

// auditor is an Auditor built without connecting: its pool connects on
// first use, after wait.
type auditor struct {
	*audit.Auditor
	logger *slog.Logger
	pool   *pgxpool.Pool
	schema string
	dep    cli.Dep
	mon    *rollback.Monitor
	close  func()
}

// build makes the Auditor: any configuration error shows here, before
// Postgres is tried. notify adds the Slack notifier (its metrics in reg,
// when set).
func (o *auditOptions) build(stderr io.Writer, reg prometheus.Registerer, notify bool) (*auditor, error) {
	logger, err := o.Log.Logger(stderr)
	if err != nil {
		return nil, err
	}
	cli.RouteLibraryLogs(logger)
	// The shared helper checks the key (no unrestricted live key unless
	// allowed) and the mode; the auditor then builds its own client from
	// the same settings so it can count list pages.
	if _, err := o.Stripe.Client(logger, nil, cli.Share{Role: stripelimit.RoleAudit}); err != nil {
		return nil, err
	}
	if err := cli.CheckSchemaFlag(o.DatabaseURL, o.Schema); err != nil {
		return nil, err
	}
	share := cli.Share{Role: stripelimit.RoleAudit, Registerer: reg, Logger: logger}
	closeRedis := func() {}
	var rdb redis.UniversalClient
	if o.RedisURL != "" {
		c, _, err := cli.NewRedis(o.RedisURL) // never waited for: Redis is optional here
		if err != nil {
			return nil, err
		}
		rdb, closeRedis = c, func() { _ = c.Close() }
		if o.Stripe.RateLimit > 0 {
			share.Redis = rdb
		}
	}
	lim, err := o.Stripe.Limiter(share)
	if err != nil {
		closeRedis()
		return nil, err
	}
	// The ledger witness: its alerts go to the log here (the Slack
	// notifier is made below, only for commands that notify).
	mon, err := cli.NewRollback("auditor", "", o.Schema, rdb, nil, logger, reg)
	if err != nil {
		closeRedis()
		return nil, err
	}
	pool, dep, err := cli.NewDB(o.DatabaseURL, int32(max(4, o.Config.Parallel+4)), mon.AfterConnect)
	if err != nil {
		closeRedis()
		return nil, err
	}
	b := &auditor{logger: logger, pool: pool, schema: o.Schema, dep: dep, mon: mon, close: func() { mon.Close(); pool.Close(); closeRedis() }}
	cfg := o.Config
	cfg.DB, cfg.Schema, cfg.Logger, cfg.Witness = pool, o.Schema, logger, mon
	cfg.Stripe = o.Stripe.Config(lim)
	if notify {
		n, err := o.Slack.Notifier(logger, reg)
		if err != nil {
			pool.Close()
			return nil, err
		}
		cfg.Notifier = n
		mon.SetNotifier(n)
		b.close = func() {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			mon.Close()
			_ = n.Close(cctx)
			pool.Close()
			closeRedis()
		}
	}
	if b.Auditor, err = audit.New(cfg); err != nil {
		b.close()
		return nil, cli.Usagef("%v", err)
	}
	return b, nil
}

// connect waits for Postgres (up to wait), checks the schema and starts
// watching the ledger for a rollback.
func (b *auditor) connect(ctx context.Context, wait time.Duration) error {
	if err := (cli.Waiter{For: wait, Logger: b.logger}).Wait(ctx, b.dep); err != nil {
		return err
	}
	if err := cli.CheckSchema(ctx, prog, b.pool, b.schema); err != nil {
		return err
	}
	if err := b.mon.Start(ctx, b.pool); err != nil {
		b.logger.Warn("checking the ledger for a rollback at start", "err", err)
	}
	return nil
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

// findingID reads the finding id before or after the flags.
func findingID(fs *flag.FlagSet, args []string) (int64, error) {
	id, rest, err := leadingID(args)
	if err != nil {
		return 0, err
	}
	if err := cli.Parse(fs, rest); err != nil {
		return 0, err
	}
	if id == 0 && fs.NArg() > 0 {
		if id, _, err = leadingID(fs.Args()); err != nil {
			return 0, err
		}
	}
	return id, nil
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
