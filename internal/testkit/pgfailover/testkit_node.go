package pgfailover

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Node is one postgres server of the cluster, reached directly (not
// through the relay).
type Node struct {
	Name    string // "primary" or "replica": its role at Start
	Port    int    // on 127.0.0.1
	DataDir string
	LogFile string // the server's stderr: read it when a test fails

	cmd    *exec.Cmd
	exited chan struct{} // closed when the postmaster has exited
	err    error         // cmd.Wait's result, once exited
}

// Addr is 127.0.0.1:port.
func (n *Node) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.Port)) }

// URL connects to this server directly as postgres, bypassing the relay.
func (n *Node) URL() string {
	return "postgres://postgres@" + n.Addr() + "/postgres?sslmode=disable&connect_timeout=5"
}

// Running reports whether the postmaster is still up.
func (n *Node) Running() bool {
	select {
	case <-n.exited:
		return false
	default:
		return true
	}
}

// startNode runs `postgres -D dataDir` as a child of the test binary (not
// daemonised by pg_ctl, so Pdeathsig and Wait apply) and waits until it
// accepts connections. A port another process took between freePort and
// bind is retried on a new port.
func (c *Cluster) startNode(ctx context.Context, name, dataDir string) (*Node, error) {
	var lastErr error
	for range 3 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		n := &Node{Name: name, Port: port, DataDir: dataDir, LogFile: dataDir + ".log", exited: make(chan struct{})}
		if err := c.spawn(n); err != nil {
			return nil, err
		}
		err = n.waitReady(ctx)
		if err == nil {
			return n, nil
		}
		lastErr = err
		_ = n.stop(syscall.SIGQUIT, 10*time.Second)
		if !strings.Contains(tail(n.LogFile), "could not bind") {
			break
		}
	}
	return nil, lastErr
}

func (c *Cluster) spawn(n *Node) error {
	logf, err := os.OpenFile(n.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("%s: creating its log: %w", n.Name, err)
	}
	defer logf.Close() // the child holds its own copy
	args := []string{"-D", n.DataDir, "-p", strconv.Itoa(n.Port), "-c", "unix_socket_directories=" + c.socketDir}
	cmd := exec.Command(c.bin+"/postgres", args...)
	cmd.Dir = c.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = procAttr(c.user)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: starting postgres: %w", n.Name, err)
	}
	n.cmd = cmd
	go func() { n.err = cmd.Wait(); close(n.exited) }()
	return nil
}

// waitReady polls until the server answers a query, failing early when
// the postmaster exits.
func (n *Node) waitReady(ctx context.Context) error {
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, n.URL())
		if err == nil {
			_, err = conn.Exec(cctx, "SELECT 1")
			_ = conn.Close(cctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-n.exited:
			return fmt.Errorf("%s exited while starting (%v); its log %s ends:\n%s", n.Name, n.err, n.LogFile, tail(n.LogFile))
		case <-ctx.Done():
			return fmt.Errorf("%s did not accept connections on %s (last error: %v); its log %s ends:\n%s: %w",
				n.Name, n.Addr(), err, n.LogFile, tail(n.LogFile), ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop signals the postmaster and waits for it, then SIGKILLs it after
// timeout. SIGQUIT is postgres's immediate shutdown (what `pg_ctl stop -m
// immediate` sends): no shutdown checkpoint, WAL not handed to standbys —
// a crash as far as the data is concerned.
func (n *Node) stop(sig syscall.Signal, timeout time.Duration) error {
	if n.cmd == nil || !n.Running() {
		return nil
	}
	if err := n.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%s: signalling postmaster: %w", n.Name, err)
	}
	select {
	case <-n.exited:
		return nil
	case <-time.After(timeout):
	}
	_ = n.cmd.Process.Kill()
	select {
	case <-n.exited:
		return fmt.Errorf("%s did not exit within %v of %v; killed it", n.Name, timeout, sig)
	case <-time.After(5 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit even on SIGKILL", n.Name, n.cmd.Process.Pid)
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free loopback port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// tail is the end of a log file, for error messages.
func tail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	defer f.Close()
	const max = 2048
	if fi, err := f.Stat(); err == nil && fi.Size() > max {
		_, _ = f.Seek(fi.Size()-max, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}
