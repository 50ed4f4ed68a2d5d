package cli

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/redact"
	"github.com/pelguard/pelguard/internal/tracing"
	"github.com/pelguard/pelguard/migrations"
	"github.com/pelguard/pelguard/stripeapi"
	"github.com/pelguard/pelguard/stripelimit"
)

// Default service URLs when neither flag nor environment names one.
const (
	DefaultRedisURL    = "redis://127.0.0.1:6379/0"
	DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
)

// RegisterRedis adds --redis-url.
func RegisterRedis(fs *flag.FlagSet, dst *string) {
	fs.StringVar(dst, "redis-url", Env("REDIS_URL", DefaultRedisURL), "Redis URL, redis://[:password@]host:port/db or rediss://; a Redis Cluster: redis+cluster://host1:port1,host2:port2/; through Redis Sentinel: redis+sentinel://[:password@]sentinel1:port1,sentinel2:port2/db?master_name=NAME (rediss+…: TLS) [REDIS_URL]")
}

// RegisterDatabase adds --database-url.
func RegisterDatabase(fs *flag.FlagSet, dst *string) {
	fs.StringVar(dst, "database-url", Env("DATABASE_URL", DefaultDatabaseURL), "Postgres URL of the ledger [DATABASE_URL]")
}

// NewRedis builds a client from url without connecting, and the Dep that
// waits for it (Waiter.Wait). A redis+cluster:// URL gives a
// *redis.ClusterClient, a redis+sentinel:// URL a failover client that
// follows the sentinels' primary, anything else a single-node client (package
// redisurl parses them all). A URL that does not parse is a UsageError.
func NewRedis(url string) (redis.UniversalClient, Dep, error) {
	if redact.Misplaced(url) {
		return nil, Dep{}, misplaced("--redis-url", url, "redis://[user]:password@host:port/db")
	}
	c, addr, fo, err := newRedisClient(url)
	if err != nil {
		return nil, Dep{}, Usagef("--redis-url %s: %s", redact.URL(url), redact.Scrub(redisUsage(err), url))
	}
	return c, Dep{Name: "Redis", Addr: addr, Env: "REDIS_URL", Permanent: redisPermanent,
		Ping: func(ctx context.Context) error { return redact.ScrubError(pingRedis(ctx, c, fo), url) }}, nil
}

// misplaced refuses a URL whose password a parser would read as a host, a
// path or a fragment: the server would quote it back in its errors (a
// database ":pw@db" does not exist), at start and whenever it reconnects.
func misplaced(flag, url, want string) error {
	return Usagef("%s %s: the text before '@' is not a URL's user and password (a slash too many or too few after the scheme, or an unencoded '/', '?', '#' or '@' in the password?); want %s, with such characters in the password percent-encoded",
		flag, redact.URL(url), want)
}

// OpenRedis is NewRedis and one try: for commands that run once and for
// the drill.
func OpenRedis(ctx context.Context, url string) (redis.UniversalClient, error) {
	c, dep, err := NewRedis(url)
	if err != nil {
		return nil, err
	}
	if err := (Waiter{}).Wait(ctx, dep); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// NewDB builds the ledger's pool without connecting (pgxpool connects on
// first use), and the Dep that waits for it. maxConns <= 0 keeps pgx's
// default. A URL that does not parse is a UsageError.
//
// afterConnect runs on every new connection before it is handed out (the
// ledger witness's check, so no statement reaches a new primary after a
// failover before the fence).
func NewDB(url string, maxConns int32, afterConnect ...func(context.Context, *pgx.Conn) error) (*pgxpool.Pool, Dep, error) {
	if redact.Misplaced(url) {
		return nil, Dep{}, misplaced("--database-url", url, "postgres://user:password@host:port/db")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, Dep{}, Usagef("--database-url %s: %v", redact.URL(url), redact.ScrubError(err, url))
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pg.PoolerSafe(cfg) // unless the URL names a query mode
	if len(afterConnect) > 0 {
		cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			for _, fn := range afterConnect {
				if err := fn(ctx, c); err != nil {
					return err
				}
			}
			return nil
		}
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, Dep{}, Usagef("--database-url %s: %v", redact.URL(url), redact.ScrubError(err, url))
	}
	addr := fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	return pool, Dep{Name: "Postgres", Addr: addr, Env: "DATABASE_URL", Permanent: postgresPermanent,
		Ping: func(ctx context.Context) error { return redact.ScrubError(pg.PoolerHint(pool.Ping(ctx)), url) }, TryTimeout: 10 * time.Second}, nil
}

// OpenDB is CheckSchemaFlag, NewDB, one try and CheckSchema: for commands
// that run once.
func OpenDB(ctx context.Context, prog, url, schema string, maxConns int32) (*pgxpool.Pool, error) {
	if err := CheckSchemaFlag(url, schema); err != nil {
		return nil, err
	}
	pool, dep, err := NewDB(url, maxConns)
	if err != nil {
		return nil, err
	}
	if err := (Waiter{}).Wait(ctx, dep); err != nil {
		pool.Close()
		return nil, err
	}
	if err := CheckSchema(ctx, prog, pool, schema); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// CheckSchema refuses to start on a database that is not ready, naming
// the command that fixes it: migrations pending in schema, or a ledger an
// earlier version left in the connection's schema (public). It writes
// nothing.
func CheckSchema(ctx context.Context, prog string, pool *pgxpool.Pool, schema string) error {
	st, err := migrations.Check(ctx, pool, schema)
	if err != nil {
		return fmt.Errorf("checking the ledger schema: %w", redact.Error(err))
	}
	if err := st.Err(prog); err != nil {
		return Usagef("%v", err)
	}
	return nil
}

// CheckSchemaFlag validates --db-schema and refuses a DATABASE_URL whose
// search_path names a different schema: the two would disagree on where
// pelguard's tables are.
func CheckSchemaFlag(url, schema string) error {
	if err := pg.ValidSchema(schema); err != nil {
		return Usagef("--db-schema: %v", err)
	}
	if redact.Misplaced(url) {
		return misplaced("DATABASE_URL", url, "postgres://user:password@host:port/db")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return Usagef("parsing DATABASE_URL %s: %v", redact.URL(url), redact.ScrubError(err, url))
	}
	if sp, ok := pg.SearchPath(cfg.ConnConfig.RuntimeParams); ok && sp != schema {
		return Usagef("DATABASE_URL sets search_path=%s but --db-schema is %s [PELGUARD_DB_SCHEMA]: "+
			"pelguard names its schema in every statement; drop search_path from the URL or set --db-schema %s", sp, schema, sp)
	}
	return nil
}

// RegisterSchema adds --db-schema, the schema of pelguard's tables.
func RegisterSchema(fs *flag.FlagSet, dst *string) {
	fs.StringVar(dst, "db-schema", Env("PELGUARD_DB_SCHEMA", migrations.DefaultSchema),
		"Postgres schema of pelguard's tables; 'migrate up' creates it, nothing outside it is touched [PELGUARD_DB_SCHEMA]")
}

// Stripe flags, shared by every binary that calls Stripe.
type Stripe struct {
	APIKey               string
	APIBase              string
	Mode                 string
	MaxRetries           int
	Timeout              time.Duration
	AllowUnrestrictedKey bool

	// The account's rate limit, shared by the fleet (package stripelimit).
	Account      string
	RateLimit    float64 // --stripe-rate: the account's requests/s, 0: none
	FallbackRate float64
	RedriveFloor float64
	AuditFloor   float64
	EndpointRate float64
	Backoff      time.Duration
}

// Register adds the Stripe flags.
func (s *Stripe) Register(fs *flag.FlagSet) {
	SecretVar(fs, &s.APIKey, "stripe-key", Env("STRIPE_API_KEY", ""), "Stripe secret or restricted key; prefer the environment [STRIPE_API_KEY]")
	fs.StringVar(&s.APIBase, "stripe-api-base", Env("STRIPE_API_BASE", ""), "Stripe API base URL; empty is Stripe itself (tests: the emulator) [STRIPE_API_BASE]")
	fs.StringVar(&s.Mode, "stripe-mode", Env("STRIPE_MODE", "payment_intents"), "how charges are made: payment_intents or charges [STRIPE_MODE]")
	fs.IntVar(&s.MaxRetries, "stripe-retries", EnvInt("STRIPE_MAX_RETRIES", 2), "stripe-go's own retries per call (same idempotency key)")
	fs.DurationVar(&s.Timeout, "stripe-timeout", EnvDuration("STRIPE_TIMEOUT", 30*time.Second), "timeout of each Stripe HTTP attempt")
	fs.BoolVar(&s.AllowUnrestrictedKey, "allow-unrestricted-key", false, "accept an unrestricted live key (sk_live_); use a restricted rk_ key instead")
	s.registerRate(fs)
}

func (s *Stripe) registerRate(fs *flag.FlagSet) {
	fs.StringVar(&s.Account, "stripe-account", Env("PELGUARD_STRIPE_ACCOUNT", stripelimit.DefaultAccount),
		"name of the Stripe account whose rate limit the fleet shares in Redis (the account id, acct_…, is a good one; never the key). The same on every consumer, reaper and auditor of the account [PELGUARD_STRIPE_ACCOUNT]")
	fs.Float64Var(&s.RateLimit, "stripe-rate", envFloat("PELGUARD_STRIPE_RATE", 0),
		"the Stripe ACCOUNT's requests per second, shared by every pelguard process on the same Redis: billing first, then re-drives, then the auditor (0: no client-side limit; Stripe allows 100/s live, 25/s in a sandbox) [PELGUARD_STRIPE_RATE]")
	fs.Float64Var(&s.FallbackRate, "stripe-fallback-rate", envFloat("PELGUARD_STRIPE_FALLBACK_RATE", 0),
		"this process's own requests per second while Redis is unreachable (and the auditor's without REDIS_URL); 0: --stripe-rate/4. Size it as --stripe-rate ÷ processes [PELGUARD_STRIPE_FALLBACK_RATE]")
	fs.Float64Var(&s.RedriveFloor, "stripe-redrive-floor", stripelimit.DefaultRedriveFloor,
		"fraction of --stripe-rate reserved for the reaper's re-drives, so billing cannot starve them (lent to the others while idle); the same on every process")
	fs.Float64Var(&s.AuditFloor, "stripe-audit-floor", stripelimit.DefaultAuditFloor,
		"fraction of --stripe-rate reserved for the auditor's reads (lent to the others while idle); the same on every process")
	fs.Float64Var(&s.EndpointRate, "stripe-endpoint-rate", envFloat("PELGUARD_STRIPE_ENDPOINT_RATE", 0),
		"requests per second per Stripe endpoint (e.g. POST /v1/charges) across the fleet, on top of --stripe-rate; Stripe documents 25/s per endpoint unless raised for the account (0: none) [PELGUARD_STRIPE_ENDPOINT_RATE]")
	fs.DurationVar(&s.Backoff, "stripe-429-backoff", stripelimit.DefaultBackoff,
		"after a 429 from Stripe, every process of the fleet pauses this long (0: no pause)")
}

func envFloat(name string, def float64) float64 {
	if v, err := strconv.ParseFloat(os.Getenv(name), 64); err == nil {
		return v
	}
	return def
}

// Validate checks the flags without building a client.
func (s *Stripe) Validate() error {
	switch {
	case s.APIKey == "":
		return Usagef("no Stripe key: set STRIPE_API_KEY (a restricted rk_ key is best)")
	case stripeapi.CheckKey(s.APIKey) != nil:
		// A key Stripe answers with 401 would start the process and
		// dead-letter every event; the message names its kind, not it.
		return Usagef("--stripe-key [STRIPE_API_KEY]: %v", stripeapi.CheckKey(s.APIKey))
	case s.Mode != "payment_intents" && s.Mode != "charges":
		return Usagef("--stripe-mode %q: want payment_intents or charges", s.Mode)
	case s.MaxRetries < 0 || s.MaxRetries > 10:
		return Usagef("--stripe-retries %d: want 0 to 10", s.MaxRetries)
	}
	return s.validateRate()
}

func (s *Stripe) validateRate() error {
	switch {
	case s.RateLimit < 0:
		return Usagef("--stripe-rate must not be negative")
	case s.RateLimit == 0 && (s.FallbackRate != 0 || s.EndpointRate != 0):
		return Usagef("--stripe-fallback-rate and --stripe-endpoint-rate refine --stripe-rate: set --stripe-rate (the account's requests per second) too")
	case s.RateLimit == 0:
		return nil
	case s.FallbackRate < 0 || s.FallbackRate > s.RateLimit:
		return Usagef("--stripe-fallback-rate %v: want 0 (--stripe-rate/4) up to --stripe-rate %v; --stripe-rate ÷ processes keeps the fleet within the account's limit while Redis is down", s.FallbackRate, s.RateLimit)
	case s.RedriveFloor < 0 || s.AuditFloor < 0 || s.RedriveFloor+s.AuditFloor >= 0.9:
		return Usagef("--stripe-redrive-floor %v and --stripe-audit-floor %v: fractions of --stripe-rate, each at least 0 and together below 0.9 (defaults %v and %v)",
			s.RedriveFloor, s.AuditFloor, stripelimit.DefaultRedriveFloor, stripelimit.DefaultAuditFloor)
	case s.EndpointRate < 0:
		return Usagef("--stripe-endpoint-rate must not be negative (0: no per-endpoint limit)")
	case s.Backoff < 0 || s.Backoff > time.Minute:
		return Usagef("--stripe-429-backoff %s: want 0 (no pause) up to 1m", s.Backoff)
	}
	if err := (s.limiterConfig(Share{})).Validate(); err != nil {
		return Usagef("--stripe-account/--stripe-rate: %v", err)
	}
	return nil
}

// Share says who shares the account's rate limit: this process's role, the
// fleet's Redis (nil: this process alone, at --stripe-fallback-rate) and
// where the limiter's series go (nil: nowhere).
type Share struct {
	Role       stripelimit.Role
	Redis      redis.UniversalClient
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

func (s *Stripe) limiterConfig(sh Share) stripelimit.Config {
	orNone := func(f float64) float64 {
		if f == 0 {
			return -1 // the flag's 0 reserves nothing; the library's 0 means its default
		}
		return f
	}
	backoff := s.Backoff
	if backoff == 0 {
		backoff = -1
	}
	return stripelimit.Config{Account: s.Account, Role: sh.Role, Rate: s.RateLimit, Redis: sh.Redis,
		FallbackRate: s.FallbackRate, RedriveFloor: orNone(s.RedriveFloor), AuditFloor: orNone(s.AuditFloor),
		EndpointRate: s.EndpointRate, Backoff: backoff, Logger: sh.Logger, Registerer: sh.Registerer}
}

// Limiter builds the account's shared limiter for sh, or nil without
// --stripe-rate.
func (s *Stripe) Limiter(sh Share) (stripeapi.Limiter, error) {
	if err := s.validateRate(); err != nil {
		return nil, err
	}
	if s.RateLimit == 0 {
		return nil, nil
	}
	l, err := stripelimit.New(s.limiterConfig(sh))
	if err != nil {
		return nil, Usagef("%v", err)
	}
	return l, nil
}

// MeterLimiter builds the schedule of live-mode meter events (Stripe's
// 1,000/s of their own, outside the account's rate), shared by the fleet as
// sh says, or nil: without --stripe-rate, or with a test key (test mode
// counts meter events against the account's rate, which Limiter paces).
func (s *Stripe) MeterLimiter(sh Share) (stripeapi.Limiter, error) {
	if s.RateLimit == 0 || !strings.Contains(s.APIKey, "_live_") {
		return nil, nil
	}
	l, err := stripelimit.New(s.limiterConfig(sh).ForMeterEvents())
	if err != nil {
		return nil, Usagef("%v", err)
	}
	return l, nil
}

// Config is the stripeapi.Config the flags make, with lim pacing it.
func (s *Stripe) Config(lim stripeapi.Limiter) stripeapi.Config {
	return stripeapi.Config{
		APIKey: s.APIKey, AllowUnrestrictedKey: s.AllowUnrestrictedKey, BaseURL: s.APIBase, Mode: stripeapi.Mode(s.Mode),
		MaxNetworkRetries: stripeapi.RetriesFromFlag(s.MaxRetries), Timeout: s.Timeout, Limiter: lim,
	}
}

// Client validates the flags and builds the adapter, paced by the account's
// limiter shared as sh says.
func (s *Stripe) Client(logger *slog.Logger, observe func(string, time.Duration, error), sh Share) (*stripeapi.Client, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if sh.Logger == nil {
		sh.Logger = logger
	}
	lim, err := s.Limiter(sh)
	if err != nil {
		return nil, err
	}
	cfg := s.Config(lim)
	cfg.Logger, cfg.Observe = logger, observe
	if cfg.MeterLimiter, err = s.MeterLimiter(sh); err != nil {
		return nil, err
	}
	c, err := stripeapi.New(cfg)
	if err != nil {
		return nil, Usagef("Stripe configuration: %v", redact.Error(err))
	}
	return c, nil
}

// Slack flags.
type Slack struct {
	WebhookURL string
	BotToken   string
	Channel    string
}

// Register adds the Slack flags (environment variables are the usual way).
func (s *Slack) Register(fs *flag.FlagSet) {
	SecretVar(fs, &s.WebhookURL, "slack-webhook-url", "", "Slack incoming webhook URL [SLACK_WEBHOOK_URL]")
	SecretVar(fs, &s.BotToken, "slack-bot-token", "", "Slack bot token, with --slack-channel [SLACK_BOT_TOKEN]")
	fs.StringVar(&s.Channel, "slack-channel", "", "Slack channel for the bot token [SLACK_CHANNEL]")
}

// Notifier builds the alerts notifier (log-only when Slack is not configured).
func (s *Slack) Notifier(logger *slog.Logger, reg prometheus.Registerer) (alerts.Notifier, error) {
	n, err := alerts.FromEnv(alerts.Config{WebhookURL: s.WebhookURL, BotToken: s.BotToken, Channel: s.Channel, Logger: logger, Registerer: reg})
	if err != nil {
		return nil, Usagef("Slack configuration: %v", redact.Error(err))
	}
	return n, nil
}

// CheckClock refuses to run on a host whose clock is more than limit away
// from Postgres'. Ledger leases are written and judged with host clocks:
// a consumer whose clock runs behind writes leases another host already
// reads as expired, one whose clock runs ahead keeps a dead consumer's
// lease alive. Every pelguard host keeps close to the one clock they all
// reach.
func CheckClock(ctx context.Context, pool *pgxpool.Pool, limit time.Duration, what string) error {
	return checkClock(ctx, pool, limit, what, time.Now)
}

func checkClock(ctx context.Context, pool *pgxpool.Pool, limit time.Duration, what string, hostNow func() time.Time) error {
	if limit <= 0 {
		return nil // a bad --lease is reported by the config check, in its own words
	}
	skew, err := pg.ClockSkew(ctx, pool, hostNow)
	if err != nil {
		return redact.Error(err)
	}
	if skew > limit || skew < -limit {
		dir := "ahead of"
		if skew < 0 {
			dir, skew = "behind", -skew
		}
		return Usagef("this host's clock is %s %s Postgres' clock, more than %s (%s): ledger leases would expire early or late; sync the clock (NTP, chrony)",
			skew.Round(time.Millisecond), dir, limit, what)
	}
	return nil
}

// DefaultMaxDBConns bounds a process's Postgres connections when
// --db-max-conns is not given: a Stripe call in flight holds none, so more
// workers do not need more connections, and a fleet of replicas must fit
// the server's max_connections.
const DefaultMaxDBConns = 16

// RegisterMaxDBConns adds --db-max-conns.
func RegisterMaxDBConns(fs *flag.FlagSet, dst *int) {
	fs.IntVar(dst, "db-max-conns", EnvInt("PELGUARD_DB_MAX_CONNS", 0),
		fmt.Sprintf("most Postgres connections this process opens (0: what its workers can use, at most %d) [PELGUARD_DB_MAX_CONNS]", DefaultMaxDBConns))
}

// MaxDBConns is the pool size: the flag when given, else want capped at
// DefaultMaxDBConns.
func MaxDBConns(flagValue, want int) (int32, error) {
	switch {
	case flagValue < 0 || flagValue == 1:
		return 0, Usagef("--db-max-conns %d: want 0 (automatic) or at least 2 (a transaction and a heartbeat at once)", flagValue)
	case flagValue > 0:
		return int32(flagValue), nil
	}
	return int32(min(want, DefaultMaxDBConns)), nil
}

// Tracing installs the OpenTelemetry SDK with the OTLP exporter when the
// standard OTEL_* variables name an endpoint (internal/tracing), for the
// binary prog. The returned stop flushes and shuts it down, bounded; it is
// a no-op when tracing is off. A broken OTEL configuration is a UsageError.
func Tracing(ctx context.Context, prog string) (stop func(), err error) {
	shutdown, err := tracing.Setup(ctx, "pelguard-"+prog)
	if err != nil {
		return nil, Usagef("%v", err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = shutdown(ctx) // spans lost at exit cost no money
	}, nil
}
