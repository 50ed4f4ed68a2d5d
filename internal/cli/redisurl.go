package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"syscall"

	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/internal/tracing"
)

// Cluster URL schemes. A Redis Cluster is named by its seed nodes, comma
// separated, in one URL:
//
//	redis+cluster://[user:password@]host1:port1,host2:port2,host3:port3[/][?option=value…]
//	rediss+cluster://…   (TLS)
//
// Options are go-redis's ClusterOptions in snake case (dial_timeout,
// read_timeout, max_retries, max_redirects, pool_size, …), exactly as
// redis.ParseClusterURL reads them; a database number is refused (a cluster
// has only database 0). Any one reachable seed is enough: the client learns
// the rest of the topology (and every later failover) from the cluster.
const (
	SchemeCluster    = "redis+cluster"
	SchemeClusterTLS = "rediss+cluster"
)

// IsClusterURL reports whether raw names a Redis Cluster.
func IsClusterURL(raw string) bool {
	s := strings.ToLower(raw)
	return strings.HasPrefix(s, SchemeCluster+"://") || strings.HasPrefix(s, SchemeClusterTLS+"://")
}

// ParseClusterURL turns a redis+cluster:// URL into go-redis cluster
// options, through redis.ParseClusterURL (the first seed becomes the URL's
// host, the others its addr= parameters).
func ParseClusterURL(raw string) (*redis.ClusterOptions, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || !IsClusterURL(raw) {
		return nil, fmt.Errorf("not a %s:// URL", SchemeCluster)
	}
	base := "redis"
	if strings.EqualFold(scheme, SchemeClusterTLS) {
		base = "rediss"
	}
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	userinfo, hosts := "", authority
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		userinfo, hosts = authority[:i+1], authority[i+1:]
	}
	path, query := tail, ""
	if i := strings.IndexByte(tail, '?'); i >= 0 {
		path, query = tail[:i], tail[i+1:]
	}
	if strings.Contains(path, "#") {
		return nil, fmt.Errorf("unexpected fragment")
	}
	if path != "" && path != "/" && path != "/0" {
		return nil, fmt.Errorf("a Redis Cluster has only database 0, not %q", strings.TrimPrefix(path, "/"))
	}
	var seeds []string
	for _, h := range strings.Split(hosts, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		if host, port, err := net.SplitHostPort(h); err != nil || host == "" || port == "" {
			return nil, fmt.Errorf("seed %q: want host:port", h)
		}
		seeds = append(seeds, h)
	}
	if len(seeds) == 0 {
		return nil, fmt.Errorf("no seed nodes: want %s://host1:port1,host2:port2/", SchemeCluster)
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, fmt.Errorf("query: %w", err)
	}
	if q.Has("addr") {
		return nil, fmt.Errorf("list seed nodes in the host part, comma separated, not as addr=")
	}
	for _, s := range seeds[1:] {
		q.Add("addr", s)
	}
	u := base + "://" + userinfo + seeds[0]
	if enc := q.Encode(); enc != "" {
		u += "?" + enc
	}
	return redis.ParseClusterURL(u)
}

// NewClusterClient is redis.NewClusterClient plus a hook that re-reads the
// cluster's topology whenever a command fails the way a shard failover makes
// it fail. go-redis reloads at once on MOVED/ASK, but a SIGKILLed master
// answers nothing: without the hook every command for its slots keeps
// dialling the dead address until the periodic reload (60 s), long after its
// replica was promoted. (Shortening ClusterStateReloadInterval instead costs
// throughput: at 1 s, go-redis v9.23 billed 45 events/s instead of ~580 in
// internal/rediscluster's benchmark.)
func NewClusterClient(opt *redis.ClusterOptions) *redis.ClusterClient {
	c := redis.NewClusterClient(opt)
	c.AddHook(failoverHook{c})
	return c
}

// failoverHook asks for a topology reload (go-redis coalesces them: one at a
// time, 200 ms apart) after errors a failover produces.
type failoverHook struct{ c *redis.ClusterClient }

func (h failoverHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h failoverHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if failoverError(err) {
			h.c.ReloadState(ctx)
		}
		return err
	}
}

func (h failoverHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if failoverError(err) {
			h.c.ReloadState(ctx)
		}
		return err
	}
}

// failoverError: the node is gone or unreachable, or the cluster says it is
// reconfiguring. All transient for pelguard: the entry stays pending, the
// ledger decides what a redelivery does.
func failoverError(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, context.Canceled) {
		return false
	}
	for _, p := range []string{"CLUSTERDOWN", "TRYAGAIN", "LOADING", "READONLY", "MASTERDOWN"} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ECONNREFUSED)
}

// newRedisClient builds a single-node or cluster client from a URL, and the
// address list to name in errors.
func newRedisClient(raw string) (redis.UniversalClient, string, error) {
	var c redis.UniversalClient
	var addr string
	if IsClusterURL(raw) {
		opt, err := ParseClusterURL(raw)
		if err != nil {
			return nil, "", err
		}
		c, addr = NewClusterClient(opt), strings.Join(opt.Addrs, ",")
	} else {
		opt, err := redis.ParseURL(raw)
		if err != nil {
			return nil, "", err
		}
		c, addr = redis.NewClient(opt), opt.Addr
	}
	if tracing.Enabled() {
		// go-redis's own instrumentation: a span per command under the
		// event's. Without the statement: command arguments carry event
		// bodies and dead-letter details.
		if err := redisotel.InstrumentTracing(c, redisotel.WithDBStatement(false)); err != nil {
			_ = c.Close()
			return nil, "", err
		}
	}
	return c, addr, nil
}
