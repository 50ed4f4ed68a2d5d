// Package rediscluster starts a throwaway Redis Cluster (masters and
// replicas, `redis-server --cluster-enabled yes` on free loopback ports in a
// temp dir, joined with `redis-cli --cluster create`) for tests and
// benchmarks, and kills its masters to drill a shard failover.
//
// scripts/services.sh cluster does the same from the shell (`make cluster`).
package rediscluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/internal/cli"
)

// ErrUnsupported means the local redis-server or redis-cli cannot run a
// cluster (too old, or built without it). Tests skip on it and fail on
// anything else.
var ErrUnsupported = errors.New("rediscluster: redis-server/redis-cli without cluster support")

// Options shape the cluster. Zero values take the defaults in brackets.
type Options struct {
	Dir         string        // parent of the nodes' dirs (required; a test's t.TempDir())
	Masters     int           // [3]
	Replicas    int           // replicas per master [1]
	NodeTimeout time.Duration // cluster-node-timeout [2s]
	// AppendFsync is the AOF policy [everysec]: with it, a killed master
	// loses up to a second of writes, like production.
	AppendFsync string
}

// Node is one redis-server process.
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

// Cluster is a running local Redis Cluster.
type Cluster struct {
	Nodes []*Node
	opts  Options
}

// Start launches the nodes, joins them and waits until every node reports
// cluster_state:ok and every replica has synced with its master.
func Start(ctx context.Context, o Options) (*Cluster, error) {
	if o.Dir == "" {
		return nil, errors.New("rediscluster: Options.Dir is required")
	}
	o.Masters = max(o.Masters, 3)
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	if o.NodeTimeout == 0 {
		o.NodeTimeout = 2 * time.Second
	}
	if o.AppendFsync == "" {
		o.AppendFsync = "everysec"
	}
	if err := checkSupport(ctx); err != nil {
		return nil, err
	}
	c := &Cluster{opts: o}
	ports, err := freePorts(o.Masters * (1 + o.Replicas))
	if err != nil {
		return nil, err
	}
	for _, p := range ports {
		n, err := c.startNode(p)
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.Nodes = append(c.Nodes, n)
	}
	for _, n := range c.Nodes {
		if err := waitPing(ctx, n); err != nil {
			c.Stop()
			return nil, err
		}
	}
	args := []string{"--cluster", "create"}
	for _, n := range c.Nodes {
		args = append(args, n.Addr())
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(o.Replicas), "--cluster-yes")
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	if err != nil {
		c.Stop()
		if strings.Contains(string(out), "Unrecognized option") || strings.Contains(string(out), "unknown") {
			return nil, fmt.Errorf("%w: redis-cli --cluster create: %s", ErrUnsupported, strings.TrimSpace(string(out)))
		}
		return nil, fmt.Errorf("rediscluster: redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.WaitHealthy(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// checkSupport asks redis-server and redis-cli whether they can run a
// cluster: redis-cli --cluster needs Redis 5 or later.
func checkSupport(ctx context.Context) error {
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("rediscluster: %s not found (install Debian's redis-server, or run `make test`, which does): %w", bin, err)
		}
	}
	out, err := exec.CommandContext(ctx, "redis-server", "--version").Output()
	if err != nil {
		return fmt.Errorf("rediscluster: redis-server --version: %w", err)
	}
	m := regexp.MustCompile(`v=(\d+)\.`).FindSubmatch(out)
	if m == nil {
		return fmt.Errorf("rediscluster: cannot read the version in %q", out)
	}
	if major, _ := strconv.Atoi(string(m[1])); major < 5 {
		return fmt.Errorf("%w: redis-server %s is older than 5", ErrUnsupported, m[1])
	}
	return nil
}

func (c *Cluster) startNode(port int) (*Node, error) {
	dir := filepath.Join(c.opts.Dir, "node-"+strconv.Itoa(port))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	n := &Node{Port: port, Dir: dir, done: make(chan struct{})}
	if err := n.start(c.opts); err != nil {
		return nil, err
	}
	return n, nil
}

func (n *Node) start(o Options) error {
	cmd := exec.Command("redis-server",
		"--port", strconv.Itoa(n.Port), "--bind", "127.0.0.1", "--dir", n.Dir,
		"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.FormatInt(o.NodeTimeout.Milliseconds(), 10),
		"--appendonly", "yes", "--appendfsync", o.AppendFsync, "--save", "",
		"--logfile", "redis.log", "--daemonize", "no")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("rediscluster: starting redis-server on %d: %w", n.Port, err)
	}
	n.cmd = cmd
	n.done = make(chan struct{})
	go func() { _ = cmd.Wait(); close(n.done) }()
	return nil
}

func waitPing(ctx context.Context, n *Node) error {
	c := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := c.Ping(ctx).Err(); err == nil {
			return nil
		}
		select {
		case <-n.done:
			log, _ := os.ReadFile(filepath.Join(n.Dir, "redis.log"))
			if strings.Contains(string(log), "cluster") && strings.Contains(string(log), "Bad directive") {
				return fmt.Errorf("%w: %s", ErrUnsupported, lastLines(log, 5))
			}
			return fmt.Errorf("rediscluster: redis-server on %d exited:\n%s", n.Port, lastLines(log, 20))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("rediscluster: redis-server on %d does not answer", n.Port)
		}
	}
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// freePorts picks n loopback ports whose cluster bus ports (+10000) are free
// too, from 20000-22699: both then lie below Linux's ephemeral range (32768+),
// so an outgoing connection cannot take one between the check and the bind.
func freePorts(n int) ([]int, error) {
	var ports []int
	seen := map[int]bool{}
	for tries := 0; len(ports) < n && tries < 1000; tries++ {
		p := 20000 + rand.IntN(2700)
		if seen[p] || seen[p+10000] || !portFree(p) || !portFree(p+10000) {
			continue
		}
		seen[p], seen[p+10000] = true, true
		ports = append(ports, p)
	}
	if len(ports) < n {
		return nil, errors.New("rediscluster: no free ports")
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

// Addrs lists every node's address (seeds for the cluster client).
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr()
	}
	return out
}

// URL is the cluster in pelguard's redis+cluster:// form.
func (c *Cluster) URL() string { return "redis+cluster://" + strings.Join(c.Addrs(), ",") + "/" }

// Client returns a cluster client for the nodes, built as cli.OpenRedis
// builds one for a redis+cluster:// URL (cli.NewClusterClient: topology
// re-read on failover errors); the caller closes it.
func (c *Cluster) Client() *redis.ClusterClient {
	return cli.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
}

// Stop kills every node and waits for them to exit.
func (c *Cluster) Stop() {
	for _, n := range c.Nodes {
		n.kill()
	}
}

// Kill SIGKILLs a node: no shutdown, no AOF flush beyond what everysec
// already wrote.
func (c *Cluster) Kill(n *Node) { n.kill() }

func (n *Node) kill() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.killed || n.cmd == nil {
		return
	}
	n.killed = true
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	<-n.done
}

// Alive reports whether the node has not been killed.
func (n *Node) Alive() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return !n.killed
}

// MasterOf returns the node that is currently master of key's slot.
func (c *Cluster) MasterOf(ctx context.Context, key string) (*Node, error) {
	for _, n := range c.Nodes {
		if !n.Alive() {
			continue
		}
		cl := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
		slot, err := cl.ClusterKeySlot(ctx, key).Result()
		var shards []redis.ClusterSlot
		if err == nil {
			//lint:ignore SA1019 CLUSTER SLOTS still answers on Redis 7 and also on the Redis 6 some machines ship; CLUSTER SHARDS does not exist there
			shards, err = cl.ClusterSlots(ctx).Result()
		}
		_ = cl.Close()
		if err != nil {
			continue
		}
		for _, s := range shards {
			if int64(s.Start) <= slot && slot <= int64(s.End) && len(s.Nodes) > 0 {
				for _, m := range c.Nodes {
					if m.Addr() == s.Nodes[0].Addr {
						return m, nil
					}
				}
			}
		}
	}
	return nil, fmt.Errorf("rediscluster: no live node knows the master of %q", key)
}

// WaitHealthy waits until every live node reports cluster_state:ok, every
// slot is served by a live master, and every live replica's link to its
// master is up. After a Kill, it returns once a replica has been promoted.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for {
		ok, why := c.healthy(ctx)
		if ok {
			return nil
		}
		last = why
		if time.Now().After(deadline) {
			return fmt.Errorf("rediscluster: not healthy after 30s: %s", last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *Cluster) healthy(ctx context.Context) (bool, string) {
	live := map[string]bool{}
	for _, n := range c.Nodes {
		if n.Alive() {
			live[n.Addr()] = true
		}
	}
	for _, n := range c.Nodes {
		if !n.Alive() {
			continue
		}
		cl := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
		info, err := cl.ClusterInfo(ctx).Result()
		var slots []redis.ClusterSlot
		var repl string
		if err == nil {
			//lint:ignore SA1019 see MasterOf
			slots, err = cl.ClusterSlots(ctx).Result()
		}
		if err == nil {
			repl, err = cl.Info(ctx, "replication").Result()
		}
		_ = cl.Close()
		if err != nil {
			return false, fmt.Sprintf("%s: %v", n.Addr(), err)
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return false, n.Addr() + ": cluster_state not ok"
		}
		covered := 0
		for _, s := range slots {
			if len(s.Nodes) == 0 || !live[s.Nodes[0].Addr] {
				return false, fmt.Sprintf("%s: slots %d-%d served by a dead master", n.Addr(), s.Start, s.End)
			}
			covered += s.End - s.Start + 1
		}
		if covered != 16384 {
			return false, fmt.Sprintf("%s: %d slots covered", n.Addr(), covered)
		}
		f := infoFields(repl)
		if f["role"] == "slave" && f["master_link_status"] != "up" {
			return false, n.Addr() + ": replica link down"
		}
	}
	return true, ""
}

// WaitReplicated waits until every live master's replicas have acknowledged
// its replication offset as of the call: what was written before is on the
// replicas too (a producer's WAIT, for the whole cluster).
func (c *Cluster) WaitReplicated(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range c.Nodes {
		if !n.Alive() {
			continue
		}
		cl := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
		err := func() error {
			defer cl.Close()
			repl, err := cl.Info(ctx, "replication").Result()
			if err != nil {
				return err
			}
			f := infoFields(repl)
			if f["role"] != "master" {
				return nil
			}
			want, _ := strconv.ParseInt(f["master_repl_offset"], 10, 64)
			for {
				repl, err := cl.Info(ctx, "replication").Result()
				if err != nil {
					return err
				}
				if minReplicaOffset(infoFields(repl)) >= want {
					return nil
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("rediscluster: replicas of %s did not reach offset %d", n.Addr(), want)
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(20 * time.Millisecond):
				}
			}
		}()
		if err != nil {
			return err
		}
	}
	return nil
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

// minReplicaOffset reads slaveN:ip=…,offset=N,… lines. A master without
// replicas (a promoted one whose old master is dead) has nothing to wait for.
func minReplicaOffset(f map[string]string) int64 {
	n, _ := strconv.Atoi(f["connected_slaves"])
	if n == 0 {
		return math.MaxInt64
	}
	low := int64(-1)
	for i := range n {
		for _, kv := range strings.Split(f["slave"+strconv.Itoa(i)], ",") {
			if k, v, ok := strings.Cut(kv, "="); ok && k == "offset" {
				o, _ := strconv.ParseInt(v, 10, 64)
				if low < 0 || o < low {
					low = o
				}
			}
		}
	}
	return low
}
