package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/internal/tracing"
	"github.com/pelguard/pelguard/redisurl"
)

// The URL forms and their parsing are package redisurl's, shared with
// library users; these names keep the binaries' code short.
const (
	SchemeCluster    = redisurl.SchemeCluster
	SchemeClusterTLS = redisurl.SchemeClusterTLS
)

// IsClusterURL reports whether raw names a Redis Cluster.
func IsClusterURL(raw string) bool { return redisurl.KindOf(raw) == redisurl.Cluster }

// ParseClusterURL is redisurl.ParseCluster.
func ParseClusterURL(raw string) (*redis.ClusterOptions, error) { return redisurl.ParseCluster(raw) }

// NewClusterClient is redisurl.NewClusterClient.
func NewClusterClient(opt *redis.ClusterOptions) *redis.ClusterClient {
	return redisurl.NewClusterClient(opt)
}

// redisPrimaryChanges counts, process wide, the changes of the primary a
// Sentinel client's connections reach.
var redisPrimaryChanges = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "pelguard_redis_primary_changes_total",
	Help: "Times this process's Redis connections (through Redis Sentinel) reached a new primary: each is a failover or a switch-over. The first primary found at start is not counted.",
})

// primaryLogger is where primary changes are logged: the command's logger,
// set by RouteLibraryLogs (slog's default before).
var primaryLogger atomic.Pointer[slog.Logger]

// lastPrimary is the primary a Sentinel client of this process reached
// last, for /readyz.
var lastPrimary atomic.Pointer[string]

func logPrimary(old, new string) {
	lastPrimary.Store(&new)
	l := primaryLogger.Load()
	if l == nil {
		l = slog.Default()
	}
	if old == "" {
		l.Info("Redis primary found through the sentinels", slog.String("primary", new))
		return
	}
	redisPrimaryChanges.Inc()
	l.Warn("Redis primary changed (a Sentinel failover or switch-over): entries read but not acknowledged on the old one come back as pending and the ledger decides each",
		slog.String("old_primary", old), slog.String("new_primary", new))
}

// RedisPrimary is the address of the primary a Sentinel client c reached
// last, or "" (not a Sentinel client, or not connected yet).
func RedisPrimary(c redis.UniversalClient) string {
	addr, _ := redisurl.Primary(c)
	return addr
}

// newRedisClient builds a single-node, cluster or Sentinel client from a
// URL, the address list to name in errors, and the Sentinel options (nil
// for the other kinds).
func newRedisClient(raw string) (redis.UniversalClient, string, *redis.FailoverOptions, error) {
	cfg, err := redisurl.Parse(raw)
	if err != nil {
		return nil, "", nil, err
	}
	cfg.OnPrimary = logPrimary
	c := cfg.NewClient()
	if tracing.Enabled() {
		// go-redis's own instrumentation: a span per command under the
		// event's. Without the statement: command arguments carry event
		// bodies and dead-letter details.
		if err := redisotel.InstrumentTracing(c, redisotel.WithDBStatement(false)); err != nil {
			_ = c.Close()
			return nil, "", nil, err
		}
	}
	return c, cfg.Addr(), cfg.Failover, nil
}

// redisUsage words a URL parse error: a refused or missing option is named
// first.
func redisUsage(err error) string {
	var oe *redisurl.OptionError
	if errors.As(err, &oe) {
		return fmt.Sprintf("option %s: %s", oe.Option, oe.Reason)
	}
	return err.Error()
}

// pingRedis is the Dep's try: a Sentinel client's error says whether the
// sentinels answered without knowing the master name.
func pingRedis(ctx context.Context, c redis.UniversalClient, fo *redis.FailoverOptions) error {
	err := c.Ping(ctx).Err()
	if fo != nil {
		return redisurl.DescribeError(fo, err)
	}
	return err
}
