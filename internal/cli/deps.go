package cli

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/redact"
	"github.com/pelguard/pelguard/internal/tracing"
	"github.com/pelguard/pelguard/migrations"
	"github.com/pelguard/pelguard/stripeapi"
)

// Default service URLs when neither flag nor environment names one.
const (
	DefaultRedisURL    = "redis://127.0.0.1:6379/0"
	DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
)

// RegisterRedis adds --redis-url.
func RegisterRedis(fs *flag.FlagSet, dst *string) {
	fs.StringVar(dst, "redis-url", Env("REDIS_URL", DefaultRedisURL), "Redis URL, redis://[:password@]host:port/db or rediss://; a Redis Cluster: redis+cluster://host1:port1,host2:port2/ [REDIS_URL]")
}

// RegisterDatabase adds --database-url.
func RegisterDatabase(fs *flag.FlagSet, dst *string) {
	fs.StringVar(dst, "database-url", Env("DATABASE_URL", DefaultDatabaseURL), "Postgres URL of the ledger [DATABASE_URL]")
}

// NewRedis builds a client from url without connecting, and the Dep that
// waits for it (Waiter.Wait). A redis+cluster:// URL (see ParseClusterURL)
// gives a *redis.ClusterClient, anything else a single-node client. A URL
// that does not parse is a UsageError.
func NewRedis(url string) (redis.UniversalClient, Dep, error) {
	c, addr, err := newRedisClient(url)
	if err != nil {
		return nil, Dep{}, Usagef("--redis-url %s: %v", redact.URL(url), redact.Error(err))
	}
	return c, Dep{Name: "Redis", Addr: addr, Env: "REDIS_URL", Permanent: redisPermanent,
		Ping: func(ctx context.Context) error { return c.Ping(ctx).Err() }}, nil
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
func NewDB(url string, maxConns int32) (*pgxpool.Pool, Dep, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, Dep{}, Usagef("--database-url %s: %v", redact.URL(url), redact.Error(err))
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, Dep{}, Usagef("--database-url %s: %v", redact.URL(url), redact.Error(err))
	}
	addr := fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	return pool, Dep{Name: "Postgres", Addr: addr, Env: "DATABASE_URL", Permanent: postgresPermanent,
		Ping: pool.Ping, TryTimeout: 10 * time.Second}, nil
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
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return Usagef("parsing DATABASE_URL %s: %v", redact.URL(url), redact.Error(err))
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
		"Postgres schema of pelguard's tables; `migrate up` creates it, nothing outside it is touched [PELGUARD_DB_SCHEMA]")
}

// Stripe flags, shared by every binary that calls Stripe.
type Stripe struct {
	APIKey               string
	APIBase              string
	Mode                 string
	MaxRetries           int
	Timeout              time.Duration
	RateLimit            float64
	AllowUnrestrictedKey bool
}

// Register adds the Stripe flags.
func (s *Stripe) Register(fs *flag.FlagSet) {
	SecretVar(fs, &s.APIKey, "stripe-key", Env("STRIPE_API_KEY", ""), "Stripe secret or restricted key; prefer the environment [STRIPE_API_KEY]")
	fs.StringVar(&s.APIBase, "stripe-api-base", Env("STRIPE_API_BASE", ""), "Stripe API base URL; empty is Stripe itself (tests: the emulator) [STRIPE_API_BASE]")
	fs.StringVar(&s.Mode, "stripe-mode", Env("STRIPE_MODE", "payment_intents"), "how charges are made: payment_intents or charges [STRIPE_MODE]")
	fs.IntVar(&s.MaxRetries, "stripe-retries", EnvInt("STRIPE_MAX_RETRIES", 2), "stripe-go's own retries per call (same idempotency key)")
	fs.DurationVar(&s.Timeout, "stripe-timeout", EnvDuration("STRIPE_TIMEOUT", 30*time.Second), "timeout of each Stripe HTTP attempt")
	fs.Float64Var(&s.RateLimit, "stripe-rate", 0, "Stripe requests per second shared by the whole process (0: no client-side limit; Stripe allows 100/s live)")
	fs.BoolVar(&s.AllowUnrestrictedKey, "allow-unrestricted-key", false, "accept an unrestricted live key (sk_live_); use a restricted rk_ key instead")
}

// Validate checks the flags without building a client.
func (s *Stripe) Validate() error {
	switch {
	case s.APIKey == "":
		return Usagef("no Stripe key: set STRIPE_API_KEY (a restricted rk_ key is best)")
	case s.Mode != "payment_intents" && s.Mode != "charges":
		return Usagef("--stripe-mode %q: want payment_intents or charges", s.Mode)
	case s.MaxRetries < 0 || s.MaxRetries > 10:
		return Usagef("--stripe-retries %d: want 0 to 10", s.MaxRetries)
	case s.RateLimit < 0:
		return Usagef("--stripe-rate must not be negative")
	}
	return nil
}

// Client validates the flags and builds the adapter.
func (s *Stripe) Client(logger *slog.Logger, observe func(string, time.Duration, error)) (*stripeapi.Client, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	c, err := stripeapi.New(stripeapi.Config{
		APIKey: s.APIKey, AllowUnrestrictedKey: s.AllowUnrestrictedKey, BaseURL: s.APIBase, Mode: stripeapi.Mode(s.Mode),
		MaxNetworkRetries: stripeapi.RetriesFromFlag(s.MaxRetries), Timeout: s.Timeout, RateLimit: s.RateLimit,
		Logger: logger, Observe: observe,
	})
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
