// Package redisurl turns the Redis URLs pelguard's binaries take into
// go-redis clients, with the same handling a library user gets: one parser
// (Parse) and one opener (Open, Config.NewClient) for a single node, a Redis
// Cluster and a primary watched by Redis Sentinel.
//
//	redis://[user:password@]host:port/db            rediss://…   (TLS)
//	redis+cluster://[user:password@]h1:p1,h2:p2/    rediss+cluster://…
//	redis+sentinel://[user:password@]s1:p1,s2:p2,…/[db]?master_name=NAME[&sentinel_username=…&sentinel_password=…]
//	rediss+sentinel://…
//
// In every form the user and password before '@' are the data node's (the
// primary's). The sentinels' own credentials, when they have any, are the
// sentinel_username and sentinel_password parameters. (go-redis's
// redis.ParseFailoverURL reads a URL the other way round; this package never
// hands it one with credentials.) Other options are go-redis's, in snake
// case (dial_timeout, read_timeout, max_retries, pool_size, …).
package redisurl

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/redis/go-redis/v9"
)

// URL schemes beside redis:// and rediss://.
const (
	SchemeCluster     = "redis+cluster"
	SchemeClusterTLS  = "rediss+cluster"
	SchemeSentinel    = "redis+sentinel"
	SchemeSentinelTLS = "rediss+sentinel"
)

// Kind is what a URL names.
type Kind int

const (
	Single   Kind = iota // one node: redis://, rediss://
	Cluster              // a Redis Cluster: redis+cluster://
	Sentinel             // a primary found through Redis Sentinel: redis+sentinel://
)

// Config is a parsed URL: exactly one of Single, Cluster and Failover is
// set, as Kind says. Adjust the options (a TLS root pool, timeouts) before
// NewClient.
type Config struct {
	Kind     Kind
	Single   *redis.Options
	Cluster  *redis.ClusterOptions
	Failover *redis.FailoverOptions

	// OnPrimary, for a Sentinel client, is called after a connection reaches
	// a primary at another address than the one before (old is "" for the
	// first), once per change.
	OnPrimary func(old, new string)
}

// OptionError is an option of the URL that pelguard refuses or needs.
type OptionError struct {
	Option string // the parameter, e.g. "replica_only"
	Reason string
}

func (e *OptionError) Error() string { return e.Option + ": " + e.Reason }

// ErrUserinfo is a URL whose user or password holds an unencoded '@':
// parsers disagree on where its host begins.
var ErrUserinfo = errors.New("the user and password hold an unencoded '@' (percent-encode it as %40)")

// Open parses raw and builds its client, without connecting.
func Open(raw string) (redis.UniversalClient, error) {
	cfg, err := Parse(raw)
	if err != nil {
		return nil, err
	}
	return cfg.NewClient(), nil
}

// KindOf reports what raw names by its scheme alone.
func KindOf(raw string) Kind {
	s := strings.ToLower(raw)
	switch {
	case strings.HasPrefix(s, SchemeCluster+"://"), strings.HasPrefix(s, SchemeClusterTLS+"://"):
		return Cluster
	case strings.HasPrefix(s, SchemeSentinel+"://"), strings.HasPrefix(s, SchemeSentinelTLS+"://"):
		return Sentinel
	}
	return Single
}

// Parse reads raw, of any of the package's forms. Its errors never quote a
// password.
func Parse(raw string) (*Config, error) {
	switch KindOf(raw) {
	case Cluster:
		opt, err := ParseCluster(raw)
		if err != nil {
			return nil, err
		}
		return &Config{Kind: Cluster, Cluster: opt}, nil
	case Sentinel:
		opt, err := ParseSentinel(raw)
		if err != nil {
			return nil, err
		}
		return &Config{Kind: Sentinel, Failover: opt}, nil
	}
	opt, err := redis.ParseURL(raw)
	if err != nil {
		return nil, err
	}
	return &Config{Kind: Single, Single: opt}, nil
}

// Addr is where the client goes, printable (no credentials): the node, the
// seed nodes, or the sentinels and the master name.
func (c *Config) Addr() string {
	switch c.Kind {
	case Cluster:
		return strings.Join(c.Cluster.Addrs, ",")
	case Sentinel:
		return fmt.Sprintf("master %q via sentinels %s", c.Failover.MasterName, strings.Join(c.Failover.SentinelAddrs, ","))
	}
	return c.Single.Addr
}

// NewClient builds the client: *redis.Client for a single node,
// *redis.ClusterClient for a cluster (see NewClusterClient), a failover
// *redis.Client for Sentinel (see NewFailoverClient).
func (c *Config) NewClient() redis.UniversalClient {
	switch c.Kind {
	case Cluster:
		return NewClusterClient(c.Cluster)
	case Sentinel:
		return NewFailoverClient(c.Failover, c.OnPrimary)
	}
	return redis.NewClient(c.Single)
}

// url is a multi-host URL split into its parts.
type multiURL struct {
	tls      bool
	userinfo *url.Userinfo
	hosts    []string
	path     string
	query    url.Values
}

// splitMulti reads scheme://[userinfo@]h1:p1,h2:p2[/path][?query]. The
// hosts are comma separated, each host:port.
func splitMulti(raw, scheme, tlsScheme, what string) (*multiURL, error) {
	sch, rest, ok := strings.Cut(raw, "://")
	if !ok || (!strings.EqualFold(sch, scheme) && !strings.EqualFold(sch, tlsScheme)) {
		return nil, fmt.Errorf("not a %s:// URL", scheme)
	}
	m := &multiURL{tls: strings.EqualFold(sch, tlsScheme)}
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	hosts := authority
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		if strings.Count(authority, "@") > 1 {
			return nil, ErrUserinfo
		}
		u, err := url.Parse("redis://" + authority[:i+1] + "h")
		if err != nil || u.User == nil {
			// url's message would quote the password.
			return nil, errors.New("the user and password do not parse (percent-encode '%', ':' and '@' in them)")
		}
		m.userinfo, hosts = u.User, authority[i+1:]
	}
	path, query := tail, ""
	if i := strings.IndexByte(tail, '?'); i >= 0 {
		path, query = tail[:i], tail[i+1:]
	}
	if strings.Contains(path, "#") || strings.Contains(query, "#") {
		return nil, errors.New("unexpected fragment ('#')")
	}
	m.path = path
	for _, h := range strings.Split(hosts, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		if host, port, err := net.SplitHostPort(h); err != nil || host == "" || port == "" {
			return nil, fmt.Errorf("%s %q: want host:port", what, h)
		}
		m.hosts = append(m.hosts, h)
	}
	if len(m.hosts) == 0 {
		return nil, fmt.Errorf("no %s: want %s://host1:port1,host2:port2/", what, scheme)
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, errors.New("the query does not parse (percent-encode '&', '=', '%' and '+' in values)")
	}
	m.query = q
	return m, nil
}
