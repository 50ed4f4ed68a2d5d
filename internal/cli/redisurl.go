package cli

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
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
	opt, err := redis.ParseClusterURL(u)
	if err != nil {
		return nil, err
	}
	opt.ClusterStateReloadInterval = ClusterStateReload
	return opt, nil
}

// ClusterStateReload is how often the cluster client re-reads the topology
// (CLUSTER SLOTS) while commands flow. go-redis reloads at once on MOVED/ASK,
// but a SIGKILLed master answers nothing: with go-redis's default (60 s)
// every command for its slots would keep dialling the dead address for up to
// a minute after its replica was promoted. One cheap CLUSTER SLOTS a second
// bounds that to about a second.
const ClusterStateReload = time.Second

// newRedisClient builds a single-node or cluster client from a URL, and the
// address list to name in errors.
func newRedisClient(raw string) (redis.UniversalClient, string, error) {
	if IsClusterURL(raw) {
		opt, err := ParseClusterURL(raw)
		if err != nil {
			return nil, "", err
		}
		return redis.NewClusterClient(opt), strings.Join(opt.Addrs, ","), nil
	}
	opt, err := redis.ParseURL(raw)
	if err != nil {
		return nil, "", err
	}
	return redis.NewClient(opt), opt.Addr, nil
}
