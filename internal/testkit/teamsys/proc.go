package teamsys

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// Role says which of the team's programs a process runs.
type Role string

const (
	// RoleConsumer is the article's final consumer (team_consumer.py):
	// XREADGROUP COUNT 1 BLOCK 5000, pre-flight SELECT, charge, INSERT, XACK.
	RoleConsumer Role = "consumer"
	// RoleMonitor is the naive stuck-message monitor (team_monitor.py):
	// XAUTOCLAIM every Interval, each reclaimed entry charged and acked.
	RoleMonitor Role = "monitor"
)

// Defaults for Config.
const (
	DefaultStripeKey       = "sk_test_teamsys"
	DefaultMonitorConsumer = "monitor-consumer"
	DefaultMinIdle         = 60 * time.Second // the article's threshold
	DefaultMonitorInterval = time.Second
	DefaultStopGrace       = 10 * time.Second
)

// Config describes one process of the team's system. Env.Start fills the
// connection fields from its Env; Start needs them all.
type Config struct {
	// Role is RoleConsumer or RoleMonitor. Required.
	Role Role
	// RedisURL is a redis:// URL redis-py understands; default testenv.RedisURL().
	RedisURL string
	// DatabaseURL is a libpq URL (psycopg2) whose search_path selects the
	// schema holding the team's billing_records; see SchemaURL. Required.
	DatabaseURL string
	// StripeURL is the emulator's base URL (stripe.api_base). Required.
	StripeURL string
	// StripeKey is the secret key the team's code charges with; default
	// DefaultStripeKey. It is also the article's KEYBRAKE_VAULT_KEY.
	StripeKey string
	// Stream and Group name the stream and its consumer group. Required.
	Stream, Group string
	// Consumer is the consumer name: XREADGROUP's for RoleConsumer (default
	// "worker-<pid>", as the article), XAUTOCLAIM's target for RoleMonitor
	// (default DefaultMonitorConsumer).
	Consumer string

	// MinIdle is the monitor's XAUTOCLAIM min-idle-time, in whole
	// milliseconds; default DefaultMinIdle. Tests use a few milliseconds.
	MinIdle time.Duration
	// Interval is the monitor's pause between passes; default DefaultMonitorInterval.
	Interval time.Duration
	// Once makes the monitor exit 0 after one pass over the PEL.
	Once bool

	// KillAfterCharges, when > 0, makes the process SIGKILL itself right
	// after the Nth charge Stripe returns, before the team's INSERT and XACK.
	KillAfterCharges int
}

// Validate reports a Config that cannot start.
func (c Config) Validate() error {
	var errs []error
	if c.Role != RoleConsumer && c.Role != RoleMonitor {
		errs = append(errs, fmt.Errorf("Role %q: want RoleConsumer or RoleMonitor", c.Role))
	}
	for name, v := range map[string]string{
		"DatabaseURL": c.DatabaseURL, "StripeURL": c.StripeURL, "Stream": c.Stream, "Group": c.Group,
	} {
		if v == "" {
			errs = append(errs, fmt.Errorf("%s is required", name))
		}
	}
	if c.MinIdle < 0 || c.Interval < 0 || c.KillAfterCharges < 0 {
		errs = append(errs, errors.New("MinIdle, Interval and KillAfterCharges must not be negative"))
	}
	return errors.Join(errs...)
}

func (c Config) env() []string {
	consumer := c.Consumer
	if c.Role == RoleMonitor {
		consumer = cmp.Or(consumer, DefaultMonitorConsumer)
	}
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"REDIS_URL=" + cmp.Or(c.RedisURL, testenv.RedisURL()),
		"DATABASE_URL=" + c.DatabaseURL,
		"STRIPE_API_BASE=" + c.StripeURL,
		"STRIPE_SECRET_KEY=" + cmp.Or(c.StripeKey, DefaultStripeKey),
		"STREAM=" + c.Stream,
		"GROUP=" + c.Group,
		"CONSUMER=" + consumer,
	}
	if c.Role == RoleMonitor {
		env = append(env,
			"MIN_IDLE_MS="+strconv.FormatInt(cmp.Or(c.MinIdle, DefaultMinIdle).Milliseconds(), 10),
			"INTERVAL_MS="+strconv.FormatInt(cmp.Or(c.Interval, DefaultMonitorInterval).Milliseconds(), 10))
		if c.Once {
			env = append(env, "MONITOR_ONCE=1")
		}
	}
	if c.KillAfterCharges > 0 {
		env = append(env, "KILL_AFTER_CHARGES="+strconv.Itoa(c.KillAfterCharges))
	}
	return env
}

// Exit is how a process ended.
type Exit struct {
	Code   int            // exit status; -1 when a signal ended it
	Signal syscall.Signal // the signal that ended it, 0 when it exited
}

// Killed reports death by SIGKILL (KillAfterCharges, or Kill).
func (e Exit) Killed() bool { return e.Signal == syscall.SIGKILL }

func (e Exit) String() string {
	if e.Signal != 0 {
		return "killed by " + e.Signal.String()
	}
	return "exit status " + strconv.Itoa(e.Code)
}

// Proc is a running process of the team's system. Its output goes to t.Log,
// line by line; the test's cleanup kills and reaps it.
type Proc struct {
	t    testing.TB
	name string
	cmd  *exec.Cmd
	out  *lineLog
	done chan struct{}
	exit Exit
}

// Start runs cfg's program under harness.py and returns at once; it fails
// the test when the process cannot start. Require is checked first.
func Start(t testing.TB, cfg Config) *Proc {
	t.Helper()
	Require(t)
	if err := cfg.Validate(); err != nil {
		t.Fatalf("teamsys: %v", err)
	}
	dir := t.TempDir()
	if err := os.CopyFS(dir, mustSub(pyFiles, "py")); err != nil {
		t.Fatalf("teamsys: writing the Python files: %v", err)
	}
	name := string(cfg.Role)
	if cfg.Consumer != "" {
		name += " " + cfg.Consumer
	}
	p := &Proc{t: t, name: name, done: make(chan struct{})}
	p.out = &lineLog{t: t, prefix: "[" + name + "] "}
	// -E: ignore PYTHON* variables; -s: no user site-packages; -u: unbuffered,
	// so a line printed just before SIGKILL still reaches the log.
	p.cmd = exec.Command(Python, "-E", "-s", "-u", filepath.Join(dir, "harness.py"), string(cfg.Role))
	p.cmd.Env = cfg.env()
	p.cmd.Dir = dir
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = sysProcAttr()
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("teamsys: starting %s: %v", name, err)
	}
	go p.reap()
	t.Cleanup(func() { p.Kill() })
	return p
}

func (p *Proc) reap() {
	err := p.cmd.Wait()
	p.exit = Exit{Code: -1}
	var ee *exec.ExitError
	switch {
	case err == nil:
		p.exit.Code = 0
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			p.exit.Signal = ws.Signal()
		} else {
			p.exit.Code = ee.ExitCode()
		}
	}
	p.out.flush()
	close(p.done)
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has ended and its output is logged.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Wait waits for the process to end by itself and reports how; after
// timeout it fails the test (and cleanup kills the process).
func (p *Proc) Wait(timeout time.Duration) Exit {
	p.t.Helper()
	select {
	case <-p.done:
		return p.exit
	case <-time.After(timeout):
		p.t.Fatalf("teamsys: %s still running after %s", p.name, timeout)
		return Exit{}
	}
}

// Kill sends SIGKILL and reaps the process. Safe to call more than once, or
// after the process ended.
func (p *Proc) Kill() Exit {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	return p.exit
}

// Stop sends SIGTERM and reaps the process, escalating to SIGKILL after
// DefaultStopGrace. The team's code installs no handler, so SIGTERM ends it
// at once, mid-charge if need be, like a Kubernetes pod's stop.
func (p *Proc) Stop() Exit {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.exit
	case <-time.After(DefaultStopGrace):
		return p.Kill()
	}
}

// Output is everything the process printed so far.
func (p *Proc) Output() string { return p.out.String() }

// lineLog copies a process's output to t.Log, one line per call, and keeps it.
type lineLog struct {
	t      testing.TB
	prefix string
	mu     sync.Mutex
	all    bytes.Buffer
	part   []byte
}

func (l *lineLog) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all.Write(b)
	l.part = append(l.part, b...)
	for {
		i := bytes.IndexByte(l.part, '\n')
		if i < 0 {
			return len(b), nil
		}
		l.log(string(l.part[:i]))
		l.part = l.part[i+1:]
	}
}

func (l *lineLog) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.part) > 0 {
		l.log(string(l.part))
		l.part = nil
	}
}

func (l *lineLog) log(line string) {
	defer func() { _ = recover() }() // t.Log after the test ended panics; drop the line.
	l.t.Log(l.prefix + strings.TrimRight(line, "\r"))
}

func (l *lineLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.all.String()
}

func mustSub(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err) // dir is a constant embedded above
	}
	return sub
}
