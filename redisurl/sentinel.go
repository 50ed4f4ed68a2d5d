package redisurl

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// refusedSentinel are go-redis failover options pelguard refuses: the first
// three read from or route to replicas, and XREADGROUP and XACK must reach
// the primary; the others clash with the URL's own forms.
var refusedSentinel = map[string]string{
	"route_by_latency": "routes commands to replicas; XREADGROUP and XACK must reach the primary",
	"route_randomly":   "routes commands to replicas; XREADGROUP and XACK must reach the primary",
	"replica_only":     "sends every command to a replica; XREADGROUP and XACK must reach the primary",
	"username":         "the data node's user goes before '@' (user:password@sentinel1:port,…); the sentinels' is sentinel_username",
	"password":         "the data node's password goes before '@' (user:password@sentinel1:port,…); the sentinels' is sentinel_password",
	"addr":             "list the sentinels in the host part, comma separated, not as addr=",
}

// ParseSentinel turns a redis+sentinel:// or rediss+sentinel:// URL into
// go-redis failover options: the user and password before '@' become the
// data node's (Username, Password), the sentinel_username and
// sentinel_password parameters the sentinels' (SentinelUsername,
// SentinelPassword). master_name is required. With TLS, each connection
// checks the certificate against the host it dials (see Dialer).
func ParseSentinel(raw string) (*redis.FailoverOptions, error) {
	m, err := splitMulti(raw, SchemeSentinel, SchemeSentinelTLS, "sentinel")
	if err != nil {
		return nil, err
	}
	q := m.query
	for k := range q {
		if why, ok := refusedSentinel[k]; ok {
			return nil, &OptionError{k, why}
		}
	}
	if q.Get("master_name") == "" {
		return nil, &OptionError{"master_name", "required: the name the sentinels monitor the primary by (sentinel monitor NAME …)"}
	}
	sentinelUser, sentinelPassword := q.Get("sentinel_username"), q.Get("sentinel_password")
	q.Del("sentinel_username")
	q.Del("sentinel_password")
	for _, s := range m.hosts[1:] {
		q.Add("addr", s)
	}
	base := "redis://"
	if m.tls {
		base = "rediss://"
	}
	// No credentials in what go-redis parses: it would read the userinfo as
	// the sentinels', and quote the URL in its errors.
	u := base + m.hosts[0] + m.path + "?" + q.Encode()
	opt, err := redis.ParseFailoverURL(u)
	if err != nil {
		return nil, err
	}
	if m.userinfo != nil {
		opt.Username = m.userinfo.Username()
		opt.Password, _ = m.userinfo.Password()
	}
	opt.SentinelUsername, opt.SentinelPassword = sentinelUser, sentinelPassword
	if opt.TLSConfig != nil {
		opt.Dialer = Dialer(opt)
	}
	return opt, nil
}

// Dialer dials each address with opt's TLS configuration, its ServerName
// set to the host dialled: go-redis's own dialer uses one configuration,
// which ParseFailoverURL gives the first sentinel's name, for every sentinel
// and for the primary. Without TLS it is a plain dialer.
func Dialer(opt *redis.FailoverOptions) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return hostDialer(opt.TLSConfig, opt.DialTimeout)
}

// hostDialer dials with base (read at each dial: a caller may still set
// its roots), its ServerName the host dialled unless verification is off;
// nil base: a plain dialer.
func hostDialer(base *tls.Config, timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	nd := &net.Dialer{Timeout: timeout, KeepAlive: 5 * time.Minute}
	if base == nil {
		return nd.DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		cfg := base.Clone()
		if !cfg.InsecureSkipVerify {
			cfg.ServerName = host
		}
		d := &tls.Dialer{NetDialer: nd, Config: cfg}
		return d.DialContext(ctx, network, addr)
	}
}

// NewFailoverClient is redis.NewFailoverClient plus a record of the primary
// its connections reach (see Primary). onPrimary, when not nil, is called
// once per change of that address (old is "" for the first). go-redis has
// no public failover callback; a dial hook sees where each new connection
// went.
func NewFailoverClient(opt *redis.FailoverOptions, onPrimary func(old, new string)) *redis.Client {
	if opt.TLSConfig != nil && opt.Dialer == nil {
		opt.Dialer = Dialer(opt)
	}
	c := redis.NewFailoverClient(opt)
	t := &tracker{on: onPrimary}
	c.AddHook(t)
	trackers.Store(c, t)
	return c
}

// trackers maps each client NewFailoverClient built to its tracker.
var trackers sync.Map

// Primary reports the address of the primary c's connections reached last,
// for a client NewFailoverClient built that has connected.
func Primary(c redis.UniversalClient) (string, bool) {
	cl, ok := c.(*redis.Client)
	if !ok {
		return "", false
	}
	v, ok := trackers.Load(cl)
	if !ok {
		return "", false
	}
	addr := v.(*tracker).current()
	return addr, addr != ""
}

type tracker struct {
	mu   sync.Mutex
	addr string
	on   func(old, new string)
}

func (t *tracker) current() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.addr
}

func (t *tracker) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil || conn == nil {
			return conn, err
		}
		now := conn.RemoteAddr().String()
		t.mu.Lock()
		old := t.addr
		t.addr = now
		t.mu.Unlock()
		if old != now && t.on != nil {
			t.on(old, now)
		}
		return conn, nil
	}
}

func (t *tracker) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (t *tracker) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// MasterUnknown reports whether err, from a Sentinel client, says that no
// sentinel that answered knows the master name (go-redis reports it as
// "all sentinels … are unreachable" with redis.Nil inside), rather than
// that none answered.
func MasterUnknown(err error) bool {
	return err != nil && errors.Is(err, redis.Nil)
}

// DescribeError explains a Sentinel client's connection error in words
// that tell its two cases apart, naming the master and the sentinels.
func DescribeError(opt *redis.FailoverOptions, err error) error {
	if err == nil {
		return nil
	}
	sentinels := strings.Join(opt.SentinelAddrs, ",")
	if MasterUnknown(err) {
		return &sentinelError{fmt.Sprintf("the sentinels that answered (of %s) know no master named %q: check master_name against their 'sentinel monitor' lines", sentinels, opt.MasterName), err}
	}
	return err
}

// sentinelError words go-redis's error (which joins one line per sentinel)
// in one sentence, keeping it for errors.Is.
type sentinelError struct {
	msg string
	err error
}

func (e *sentinelError) Error() string { return e.msg }
func (e *sentinelError) Unwrap() error { return e.err }
