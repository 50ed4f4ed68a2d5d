// Package redissentinel starts a throwaway Redis Sentinel set for tests: a
// primary (appendonly yes, appendfsync everysec), replicas and three
// sentinels (`redis-server FILE --sentinel`, quorum 2) on loopback ports it
// picks, in a temp dir; it kills the primary or a sentinel to drill a
// failover, asks for a planned one (SENTINEL FAILOVER), and stops every
// process at the end.
package redissentinel

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrUnsupported means the local redis-server cannot run a sentinel. Tests
// skip on it, with Install in the message.
var ErrUnsupported = errors.New("redissentinel: redis-server cannot run in sentinel mode")

// Install says how to get a redis-server that can.
const Install = "install Debian's redis-server (apt-get install -y redis-server), which runs a sentinel as `redis-server FILE --sentinel`"

// Options shape the set. Zero values take the defaults in brackets.
type Options struct {
	Dir       string        // parent of the processes' dirs (required; a test's t.TempDir())
	Master    string        // the master name ["pelguard"]
	Replicas  int           // [1]
	Sentinels int           // [3]
	Quorum    int           // [2]
	DownAfter time.Duration // down-after-milliseconds [1s]
	// FailoverTimeout is the sentinels' failover-timeout [3s]: a second
	// failover of the same master waits twice as long.
	FailoverTimeout time.Duration
	// Password is the data nodes' requirepass (and masterauth), and
	// SentinelPassword the sentinels' requirepass; empty: none.
	Password, SentinelPassword string
}

// Node is one redis-server process, a data node or a sentinel.
type Node struct {
	Port int
	Dir  string
	cmd  *exec.Cmd
	done chan struct{}

	mu     sync.Mutex
	killed bool
}

// Addr is 127.0.0.1:port.
func (n *Node) Addr() string { return "127.0.0.1:" + strconv.Itoa(n.Port) }

// Alive reports whether the process runs.
func (n *Node) Alive() bool {
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

// Set is a running primary, its replicas and the sentinels watching them.
type Set struct {
	Data      []*Node // Data[0] is the first primary
	Sentinels []*Node
	opts      Options
}

// Start launches the data nodes, waits for the replicas to sync, then the
// sentinels, and waits until every sentinel knows the primary, its
// replicas and the other sentinels.
func Start(ctx context.Context, o Options) (*Set, error) {
	if o.Dir == "" {
		return nil, errors.New("redissentinel: Options.Dir is required")
	}
	if o.Master == "" {
		o.Master = "pelguard"
	}
	o.Replicas = max(o.Replicas, 1)
	o.Sentinels = max(o.Sentinels, 3)
	o.Quorum = max(o.Quorum, 2)
	if o.DownAfter == 0 {
		o.DownAfter = time.Second
	}
	if o.FailoverTimeout == 0 {
		o.FailoverTimeout = 3 * time.Second
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("%w: redis-server not found: %s", ErrUnsupported, Install)
	}
	ports, err := freePorts(1 + o.Replicas + o.Sentinels)
	if err != nil {
		return nil, err
	}
	s := &Set{opts: o}
	for i := range 1 + o.Replicas {
		args := []string{"--appendonly", "yes", "--appendfsync", "everysec", "--save", ""}
		if o.Password != "" {
			args = append(args, "--requirepass", o.Password, "--masterauth", o.Password)
		}
		if i > 0 {
			args = append(args, "--replicaof", "127.0.0.1", strconv.Itoa(ports[0]))
		}
		n, err := start(filepath.Join(o.Dir, "data-"+strconv.Itoa(ports[i])), ports[i], "", args...)
		if err != nil {
			s.Stop()
			return nil, err
		}
		s.Data = append(s.Data, n)
	}
	for _, n := range s.Data {
		if err := waitPing(ctx, n, o.Password); err != nil {
			s.Stop()
			return nil, err
		}
	}
	if err := s.waitSynced(ctx, s.Data[0], o.Replicas); err != nil {
		s.Stop()
		return nil, err
	}
	for _, p := range ports[1+o.Replicas:] {
		dir := filepath.Join(o.Dir, "sentinel-"+strconv.Itoa(p))
		conf := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile redis.log\n"+
			"sentinel monitor %s 127.0.0.1 %d %d\n"+
			"sentinel down-after-milliseconds %s %d\n"+
			"sentinel failover-timeout %s %d\n"+
			"sentinel parallel-syncs %s 1\n",
			p, dir, o.Master, ports[0], o.Quorum, o.Master, o.DownAfter.Milliseconds(),
			o.Master, o.FailoverTimeout.Milliseconds(), o.Master)
		if o.Password != "" {
			conf += fmt.Sprintf("sentinel auth-pass %s %s\n", o.Master, o.Password)
		}
		if o.SentinelPassword != "" {
			conf += fmt.Sprintf("requirepass %s\nsentinel sentinel-pass %s\n", o.SentinelPassword, o.SentinelPassword)
		}
		n, err := start(dir, p, conf)
		if err != nil {
			s.Stop()
			return nil, err
		}
		s.Sentinels = append(s.Sentinels, n)
	}
	for _, n := range s.Sentinels {
		if err := waitPing(ctx, n, o.SentinelPassword); err != nil {
			s.Stop()
			return nil, err
		}
	}
	if err := s.waitDiscovered(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// start runs redis-server in dir: a sentinel when conf is not empty (its
// file, which the sentinel rewrites), else a data node with args.
func start(dir string, port int, conf string, args ...string) (*Node, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var cmd *exec.Cmd
	if conf != "" {
		file := filepath.Join(dir, "sentinel.conf")
		if err := os.WriteFile(file, []byte(conf), 0o644); err != nil {
			return nil, err
		}
		cmd = exec.Command("redis-server", file, "--sentinel")
	} else {
		cmd = exec.Command("redis-server", append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--dir", dir, "--logfile", "redis.log", "--daemonize", "no"}, args...)...)
	}
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("redissentinel: starting redis-server on %d: %w", port, err)
	}
	n := &Node{Port: port, Dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(n.done) }()
	return n, nil
}

func waitPing(ctx context.Context, n *Node, password string) error {
	c := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1, Password: password})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := c.Ping(ctx).Err(); err == nil {
			return nil
		}
		select {
		case <-n.done:
			log, _ := os.ReadFile(filepath.Join(n.Dir, "redis.log"))
			if strings.Contains(strings.ToLower(string(log)), "sentinel") && (strings.Contains(string(log), "Bad directive") || strings.Contains(string(log), "not supported")) {
				return fmt.Errorf("%w: %s: %s", ErrUnsupported, lastLines(log, 5), Install)
			}
			return fmt.Errorf("redissentinel: redis-server on %d exited:\n%s", n.Port, lastLines(log, 20))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redissentinel: redis-server on %d does not answer", n.Port)
		}
	}
}

// waitSynced waits until primary reports want connected replicas online.
func (s *Set) waitSynced(ctx context.Context, primary *Node, want int) error {
	c := s.Client(primary)
	defer c.Close()
	return poll(ctx, 20*time.Second, func() (bool, error) {
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return false, nil
		}
		f := infoFields(info)
		online := 0
		for i := range want {
			if strings.Contains(f["slave"+strconv.Itoa(i)], "state=online") {
				online++
			}
		}
		return f["role"] == "master" && online >= want, nil
	}, "replicas of %s in sync", primary.Addr())
}

// waitDiscovered waits until every live sentinel names the primary and
// knows the other sentinels and the replicas.
func (s *Set) waitDiscovered(ctx context.Context) error {
	return poll(ctx, 30*time.Second, func() (bool, error) {
		for _, sn := range s.Sentinels {
			if !sn.Alive() {
				continue
			}
			c := s.sentinel(sn)
			m, err := c.Master(ctx, s.opts.Master).Result()
			c.Close()
			if err != nil {
				return false, nil
			}
			others, _ := strconv.Atoi(m["num-other-sentinels"])
			replicas, _ := strconv.Atoi(m["num-slaves"])
			if others < len(s.Sentinels)-1 || replicas < s.opts.Replicas {
				return false, nil
			}
		}
		return true, nil
	}, "sentinels discover each other and the replicas")
}

// URL is the set in pelguard's redis+sentinel:// form, database 0, with
// both passwords: the data nodes' before '@', the sentinels' as
// sentinel_password.
func (s *Set) URL() string {
	addrs := make([]string, len(s.Sentinels))
	for i, n := range s.Sentinels {
		addrs[i] = n.Addr()
	}
	userinfo := ""
	if s.opts.Password != "" {
		userinfo = url.UserPassword("", s.opts.Password).String() + "@"
	}
	q := url.Values{"master_name": {s.opts.Master}}
	if s.opts.SentinelPassword != "" {
		q.Set("sentinel_password", s.opts.SentinelPassword)
	}
	return "redis+sentinel://" + userinfo + strings.Join(addrs, ",") + "/0?" + q.Encode()
}

// Client is a plain client of one data node; the caller closes it.
func (s *Set) Client(n *Node) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: n.Addr(), Password: s.opts.Password, MaxRetries: -1})
}

func (s *Set) sentinel(n *Node) *redis.SentinelClient {
	return redis.NewSentinelClient(&redis.Options{Addr: n.Addr(), Password: s.opts.SentinelPassword, MaxRetries: -1})
}

// Master is the master name.
func (s *Set) Master() string { return s.opts.Master }

// Primary is the data node a majority of the live sentinels name.
func (s *Set) Primary(ctx context.Context) (*Node, error) {
	votes := map[string]int{}
	live := 0
	for _, sn := range s.Sentinels {
		if !sn.Alive() {
			continue
		}
		live++
		c := s.sentinel(sn)
		a, err := c.GetMasterAddrByName(ctx, s.opts.Master).Result()
		c.Close()
		if err == nil && len(a) == 2 {
			votes[net.JoinHostPort(a[0], a[1])]++
		}
	}
	for addr, v := range votes {
		if v*2 > live {
			for _, n := range s.Data {
				if n.Addr() == addr {
					return n, nil
				}
			}
			return nil, fmt.Errorf("redissentinel: sentinels name %s, not a node of the set", addr)
		}
	}
	return nil, fmt.Errorf("redissentinel: the sentinels disagree on the primary: %v", votes)
}

// WaitPromoted waits until the live sentinels agree on a primary other
// than old, and that node says it is one. It returns the new primary.
func (s *Set) WaitPromoted(ctx context.Context, old *Node, within time.Duration) (*Node, error) {
	var got *Node
	err := poll(ctx, within, func() (bool, error) {
		p, err := s.Primary(ctx)
		if err != nil || p == old {
			return false, nil
		}
		c := s.Client(p)
		defer c.Close()
		info, err := c.Info(ctx, "replication").Result()
		if err != nil || infoFields(info)["role"] != "master" {
			return false, nil
		}
		got = p
		return true, nil
	}, "a replica of %s promoted", old.Addr())
	return got, err
}

// Failover asks a sentinel for a planned switch-over (SENTINEL FAILOVER)
// and waits for the new primary, which it returns.
func (s *Set) Failover(ctx context.Context, within time.Duration) (*Node, error) {
	old, err := s.Primary(ctx)
	if err != nil {
		return nil, err
	}
	err = poll(ctx, within, func() (bool, error) {
		for _, sn := range s.Sentinels {
			if !sn.Alive() {
				continue
			}
			c := s.sentinel(sn)
			err := c.Failover(ctx, s.opts.Master).Err()
			c.Close()
			// INPROG, or NOGOODSLAVE while a replica still syncs: try again.
			return err == nil, nil
		}
		return false, errors.New("redissentinel: no live sentinel")
	}, "SENTINEL FAILOVER accepted")
	if err != nil {
		return nil, err
	}
	p, err := s.WaitPromoted(ctx, old, within)
	if err != nil {
		return nil, err
	}
	// The old primary comes back as a replica of the new one.
	return p, s.waitSynced(ctx, p, 1)
}

// WaitReplicated waits until every replica of the current primary has
// everything it accepted (WAIT).
func (s *Set) WaitReplicated(ctx context.Context, replicas int) error {
	p, err := s.Primary(ctx)
	if err != nil {
		return err
	}
	c := s.Client(p)
	defer c.Close()
	n, err := c.Wait(ctx, replicas, 10*time.Second).Result()
	if err != nil {
		return err
	}
	if n < int64(replicas) {
		return fmt.Errorf("redissentinel: %d of %d replicas acknowledged", n, replicas)
	}
	return nil
}

// Kill SIGKILLs a node (data node or sentinel) and waits for it to exit.
func (s *Set) Kill(n *Node) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.killed || n.cmd == nil || n.cmd.Process == nil {
		return
	}
	n.killed = true
	_ = n.cmd.Process.Kill()
	<-n.done
}

// Stop kills every process of the set.
func (s *Set) Stop() {
	for _, n := range append(append([]*Node{}, s.Sentinels...), s.Data...) {
		s.Kill(n)
	}
}

func poll(ctx context.Context, within time.Duration, cond func() (bool, error), format string, args ...any) error {
	deadline := time.Now().Add(within)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redissentinel: not within %s: "+format, append([]any{within}, args...)...)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(25 * time.Millisecond):
		}
	}
}

func infoFields(s string) map[string]string {
	f := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":"); ok {
			f[k] = v
		}
	}
	return f
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// freePorts picks n loopback ports from 23000-25999, below Linux's
// ephemeral range (32768+), so an outgoing connection cannot take one
// between the check and the bind.
func freePorts(n int) ([]int, error) {
	var ports []int
	seen := map[int]bool{}
	for tries := 0; len(ports) < n && tries < 1000; tries++ {
		p := 23000 + rand.IntN(3000)
		if seen[p] || !portFree(p) {
			continue
		}
		seen[p] = true
		ports = append(ports, p)
	}
	if len(ports) < n {
		return nil, errors.New("redissentinel: no free ports")
	}
	return ports, nil
}

func portFree(p int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}
