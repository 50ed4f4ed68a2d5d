package redisurl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// ParseCluster turns a redis+cluster:// URL into go-redis cluster options,
// through redis.ParseClusterURL (the first seed becomes the URL's host, the
// others its addr= parameters). A database number is refused (a cluster has
// only database 0). Any one reachable seed is enough: the client learns the
// rest of the topology (and every later failover) from the cluster.
func ParseCluster(raw string) (*redis.ClusterOptions, error) {
	m, err := splitMulti(raw, SchemeCluster, SchemeClusterTLS, "seed")
	if err != nil {
		return nil, err
	}
	if m.path != "" && m.path != "/" && m.path != "/0" {
		return nil, fmt.Errorf("a Redis Cluster has only database 0, not %q", strings.TrimPrefix(m.path, "/"))
	}
	if m.query.Has("addr") {
		return nil, &OptionError{"addr", "list seed nodes in the host part, comma separated, not as addr="}
	}
	q := m.query
	for _, s := range m.hosts[1:] {
		q.Add("addr", s)
	}
	base := "redis://"
	if m.tls {
		base = "rediss://"
	}
	u := base + m.hosts[0]
	if enc := q.Encode(); enc != "" {
		u += "/?" + enc
	}
	opt, err := redis.ParseClusterURL(u)
	if err != nil {
		return nil, err
	}
	if m.userinfo != nil {
		opt.Username = m.userinfo.Username()
		opt.Password, _ = m.userinfo.Password()
	}
	if opt.TLSConfig != nil {
		// Each node is dialled under its own name: go-redis would verify
		// every node's certificate against the first seed's name.
		opt.Dialer = hostDialer(opt.TLSConfig, opt.DialTimeout)
	}
	return opt, nil
}

// NewClusterClient is redis.NewClusterClient plus a hook that re-reads the
// cluster's topology whenever a command fails the way a shard failover makes
// it fail. go-redis reloads at once on MOVED/ASK, but a SIGKILLed master
// answers nothing: without the hook every command for its slots keeps
// dialling the dead address until the periodic reload (60 s), long after its
// replica was promoted. (Shortening ClusterStateReloadInterval instead costs
// throughput: at 1 s, go-redis v9.23 billed 45 events/s instead of ~580 in
// pelguard's cluster benchmark.)
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
		if FailoverError(err) {
			h.c.ReloadState(ctx)
		}
		return err
	}
}

func (h failoverHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if FailoverError(err) {
			h.c.ReloadState(ctx)
		}
		return err
	}
}

// FailoverError reports an error a failover produces: the node is gone or
// unreachable, or says it is reconfiguring, loading, read-only (a demoted
// primary) or unblocked a blocked read. Each is transient for pelguard: the
// entry stays pending, the ledger decides what a redelivery does.
func FailoverError(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, context.Canceled) {
		return false
	}
	for _, p := range []string{"CLUSTERDOWN", "TRYAGAIN", "LOADING", "READONLY", "MASTERDOWN", "UNBLOCKED"} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET)
}
