// Package pgfailover is a TEST KIT, not product code: it runs a real
// PostgreSQL primary with an asynchronous streaming replica on loopback
// ports (Debian's server binaries, initdb in t.TempDir()), and drills a
// failover that loses commits — the replica stalled, the primary killed,
// the replica promoted, clients moved to it through a relay that plays the
// VIP. Only _test.go files may import it (TestOnlyImportedByTests guards
// that). docs/testing-failover.md describes it.
//
//	c := pgfailover.Start(t, pgfailover.Options{})
//	db := connect(c.URL())                // through the relay, to the primary
//	... write, then c.StallReplication(ctx), write more (committed, never replicated)
//	loss, err := c.FailoverLosingCommits(ctx)
//	db = connect(c.URL())                 // now the promoted replica, without those commits
package pgfailover

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Options shape the cluster. Zero values take the defaults in brackets.
type Options struct {
	// Conf lines appended to postgresql.conf of both servers (the replica's
	// is a copy of the primary's), e.g. "synchronous_commit = off".
	Conf []string
	// Timeout bounds each wait: a server starting, the base backup, the
	// replica catching up, the promotion [30s].
	Timeout time.Duration
}

// baseConf is appended to the primary's postgresql.conf before its first
// start. fsync=off: the data directories are thrown away, and a killed
// primary is never restarted, so durability on disk buys nothing here and
// costs seconds on a shared machine; what a failover loses is decided by
// replication, which fsync does not change. autovacuum=off keeps WAL quiet
// between a test's own writes. track_commit_timestamp lets
// FailoverLosingCommits see which commit each server last applied.
var baseConf = []string{
	"listen_addresses = '127.0.0.1'",
	"fsync = off",
	"full_page_writes = off",
	"wal_level = replica",
	"max_wal_senders = 4",
	"hot_standby = on",
	"shared_buffers = 16MB",
	"max_connections = 40",
	"autovacuum = off",
	"track_commit_timestamp = on",
	"log_min_messages = warning",
}

// hba trusts loopback TCP and the socket, nothing else.
const hba = `local all all trust
local replication all trust
host all all 127.0.0.1/32 trust
host replication all 127.0.0.1/32 trust
`

// Cluster is a running primary and asynchronous replica.
type Cluster struct {
	t         testing.TB
	opts      Options
	bin       string
	user      runAs
	dir       string
	socketDir string // "" disables unix sockets (path too long for sun_path)

	client *relay // URL(): clients' way in, to the current primary
	repl   *relay // the replica's replication connection, pausable

	mu       sync.Mutex
	primary  *Node // the current primary (the promoted replica after Promote)
	replica  *Node // nil once promoted
	oldPrime *Node // the killed primary, after Promote
	stalled  bool
}

// Start runs the primary and replica and waits until the replica streams.
// Everything stops and is removed at t.Cleanup, whatever the test's
// outcome. Without the server binaries, or as root without a postgres OS
// user, the test is skipped with how to install them — and fails under
// CI=true, where a skip would be a silent pass.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Timeout == 0 {
		opts.Timeout = 30 * time.Second
	}
	bin, err := findBinDir(systemLookup())
	if err != nil {
		skipOrFail(t, err)
	}
	u, err := serverUser(os.Geteuid(), userLookup)
	if err != nil {
		skipOrFail(t, err)
	}
	c := &Cluster{t: t, opts: opts, bin: bin, user: u, dir: t.TempDir()}
	t.Cleanup(c.stopAll) // registered after TempDir's, so it runs before the removal
	if err := c.start(); err != nil {
		t.Fatalf("pgfailover: %v", err)
	}
	return c
}

func (c *Cluster) start() error {
	ctx, cancel := context.WithTimeout(context.Background(), 4*c.opts.Timeout)
	defer cancel()
	if err := c.prepareDir(); err != nil {
		return err
	}
	primaryDir := filepath.Join(c.dir, "primary")
	if err := c.run(ctx, "initdb", "-D", primaryDir, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"); err != nil {
		return err
	}
	conf := append(append([]string{"", "# pgfailover"}, baseConf...), c.opts.Conf...)
	if err := appendFile(filepath.Join(primaryDir, "postgresql.conf"), strings.Join(conf, "\n")+"\n"); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(primaryDir, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		return fmt.Errorf("writing pg_hba.conf: %w", err)
	}
	if err := c.chown(primaryDir); err != nil {
		return err
	}
	sctx, scancel := context.WithTimeout(ctx, c.opts.Timeout)
	primary, err := c.startNode(sctx, "primary", primaryDir)
	scancel()
	if err != nil {
		return err
	}
	c.setPrimary(primary)

	// The replica replicates through c.repl, so StallReplication can cut it
	// off; pg_basebackup -R writes that address into primary_conninfo.
	if c.repl, err = newRelay(primary.Addr()); err != nil {
		return err
	}
	replicaDir := filepath.Join(c.dir, "replica")
	if err := c.run(ctx, "pg_basebackup", "-D", replicaDir, "-h", "127.0.0.1", "-p", portOf(c.repl.Addr()),
		"-U", "postgres", "-w", "-R", "-X", "stream", "--checkpoint=fast", "--no-sync"); err != nil {
		return err
	}
	sctx, scancel = context.WithTimeout(ctx, c.opts.Timeout)
	replica, err := c.startNode(sctx, "replica", replicaDir)
	scancel()
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.replica = replica
	c.mu.Unlock()
	if c.client, err = newRelay(primary.Addr()); err != nil {
		return err
	}
	wctx, wcancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer wcancel()
	return c.WaitReplicaCaughtUp(wctx)
}

// prepareDir makes the cluster dir usable by the server's OS user. As
// root the servers run as postgres, who must traverse t.TempDir()'s parent
// (created 0700 for root) and own the cluster dir.
func (c *Cluster) prepareDir() error {
	if c.user.asRoot {
		if err := os.Chmod(filepath.Dir(c.dir), 0o711); err != nil {
			return fmt.Errorf("letting postgres reach %s: %w", c.dir, err)
		}
		if err := os.Chmod(c.dir, 0o700); err != nil {
			return fmt.Errorf("chmod %s: %w", c.dir, err)
		}
		if err := c.chown(c.dir); err != nil {
			return err
		}
	}
	// sun_path holds 107 bytes; a long test name makes a long TempDir. Rather
	// than fall back to a shared socket dir, go TCP-only then.
	if sock := filepath.Join(c.dir, ".s.PGSQL.65535.lock"); len(sock) < 100 {
		c.socketDir = c.dir
	}
	return nil
}

func (c *Cluster) chown(path string) error {
	if !c.user.asRoot {
		return nil
	}
	return filepath.Walk(path, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if err := os.Lchown(p, int(c.user.uid), int(c.user.gid)); err != nil {
			return fmt.Errorf("chown %s to postgres: %w", p, err)
		}
		return nil
	})
}

// run runs one of the server's programs as the server's user, bounded by
// ctx and opts.Timeout, with its output in the error.
func (c *Cluster) run(ctx context.Context, prog string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, prog), args...)
	cmd.Dir = c.dir
	cmd.SysProcAttr = procAttr(c.user)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (after %v)", ctx.Err(), c.opts.Timeout)
		}
		return fmt.Errorf("%s: %w; output:\n%s", prog, err, out)
	}
	return nil
}

// URL is the relay's address as a connection URL: the current primary,
// whichever server that is. Failover moves it; connections made before a
// failover are closed by it, as clients of a moved VIP see.
func (c *Cluster) URL() string {
	return "postgres://postgres@" + c.client.Addr() + "/postgres?sslmode=disable&connect_timeout=5"
}

// Primary is the current primary: the promoted replica after Promote.
func (c *Cluster) Primary() *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.primary
}

// Replica is the standby, nil once it has been promoted.
func (c *Cluster) Replica() *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.replica
}

func (c *Cluster) setPrimary(n *Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.primary = n
}

// stopAll ends both servers and relays; t.TempDir's own cleanup then
// removes the directories.
func (c *Cluster) stopAll() {
	c.mu.Lock()
	nodes := []*Node{c.primary, c.replica, c.oldPrime}
	c.mu.Unlock()
	var errs []error
	for _, r := range []*relay{c.client, c.repl} {
		if r != nil {
			errs = append(errs, r.Close())
		}
	}
	for _, n := range nodes {
		if n != nil {
			errs = append(errs, n.stop(syscall.SIGQUIT, 10*time.Second))
		}
	}
	if err := errors.Join(errs...); err != nil {
		c.t.Errorf("pgfailover: stopping the cluster: %v", err)
	}
}

func appendFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", path, err)
	}
	if _, err := f.WriteString(s); err != nil {
		_ = f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}

func portOf(addr string) string { return addr[strings.LastIndexByte(addr, ':')+1:] }

// connect opens one direct connection, closed by the caller.
func connect(ctx context.Context, n *Node) (*pgx.Conn, error) {
	conn, err := pgx.Connect(ctx, n.URL())
	if err != nil {
		return nil, fmt.Errorf("connecting to the %s on %s: %w", n.Name, n.Addr(), err)
	}
	return conn, nil
}
