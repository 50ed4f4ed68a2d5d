// Package pgbouncer starts a real PgBouncer (Debian's `pgbouncer`) in
// transaction mode in front of the test Postgres, on a loopback port it
// picks, for the tests of pelguard behind a connection pooler. The pooler
// is stopped when the test ends. Without the binary the test is skipped
// with the command that installs it (failed under CI=true, where .ci/run
// installs it).
package pgbouncer

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// InstallHint says how to get the binary.
const InstallHint = "apt-get install -y pgbouncer"

// Config is the pooler's set-up.
type Config struct {
	// IgnoreSearchPath lists search_path (and extra_float_digits, options)
	// in ignore_startup_parameters, as many deployment guides do: the
	// pooler then accepts a URL's search_path and drops it silently. The
	// stock configuration (false) refuses such a connection.
	IgnoreSearchPath bool
	// PoolSize is default_pool_size, the server connections per database
	// and user (0: 20).
	PoolSize int
	// Server is the URL of the Postgres the pooler fronts (empty:
	// testenv's DATABASE_URL). Repoint moves the pooler to another server.
	Server string
}

// Bouncer is a running PgBouncer.
type Bouncer struct {
	Port int
	cmd  *exec.Cmd
	out  *syncBuffer
	base *url.URL

	mu   sync.Mutex
	conf string // pgbouncer.ini's path
	tmpl string // its text, with %s for the [databases] section
	// The kit restarts a PgBouncer that exits by itself, as the
	// supervisor the docs ask for would: 1.18 exits on a cancel request
	// whose client is gone ("bad client state"), a bug of its own.
	bin      string
	args     []string
	stopping bool
	restarts int
	done     chan struct{} // closed when the supervisor stops
}

// Start runs PgBouncer in transaction mode in front of testenv's
// DATABASE_URL, until the test ends.
func Start(t testing.TB, cfg Config) *Bouncer {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("pgbouncer is required for the connection-pooler tests (%s): %v", InstallHint, err)
		}
		t.Skipf("pgbouncer not found: %s to run the connection-pooler tests", InstallHint)
	}
	server := cfg.Server
	if server == "" {
		server = testenv.DatabaseURL()
	}
	base, err := url.Parse(server)
	if err != nil {
		t.Fatalf("the pooler's server URL: %v", err)
	}
	port := base.Port()
	if port == "" {
		port = "5432"
	}
	usr := base.User.Username()
	if usr == "" {
		usr = "postgres"
	}
	// PgBouncer refuses to run as root; it drops to -u's user after
	// reading its configuration, so the directory must be readable by it.
	dir, err := os.MkdirTemp("", "pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ignore := "extra_float_digits"
	if cfg.IgnoreSearchPath {
		ignore = "extra_float_digits,search_path,options"
	}
	pool := cfg.PoolSize
	if pool == 0 {
		pool = 20
	}
	auth := filepath.Join(dir, "users.txt")
	if err := os.WriteFile(auth, fmt.Appendf(nil, "%q \"\"\n", usr), 0o644); err != nil {
		t.Fatal(err)
	}
	for attempt := 0; ; attempt++ {
		p := freePort(t)
		ini := filepath.Join(dir, "pgbouncer.ini")
		// The template keeps %s for the [databases] section, which Repoint
		// rewrites.
		tmpl := fmt.Sprintf(`[databases]
%%s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 1000
ignore_startup_parameters = %s
server_lifetime = 3600
server_login_retry = 1
stats_period = 1
admin_users = %s
stats_users = %s
`, p, auth, pool, ignore, usr, usr)
		if err := os.WriteFile(ini, []byte(fmt.Sprintf(tmpl, databases(base.Hostname(), port))), 0o644); err != nil {
			t.Fatal(err)
		}
		args := []string{ini}
		if os.Geteuid() == 0 {
			nobody, err := user.Lookup("nobody")
			if err != nil {
				t.Skipf("pgbouncer will not run as root and there is no user nobody to run it as: %v", err)
			}
			args = []string{"-u", nobody.Username, ini}
		}
		b := &Bouncer{Port: p, out: &syncBuffer{}, base: base, conf: ini, tmpl: tmpl, bin: bin, args: args,
			done: make(chan struct{})}
		exited, err := b.start()
		if err != nil {
			t.Fatalf("starting pgbouncer: %v", err)
		}
		if b.ready(exited) {
			go b.supervise(exited)
			t.Cleanup(func() {
				b.mu.Lock()
				b.stopping = true
				proc := b.cmd.Process
				b.mu.Unlock()
				_ = proc.Signal(syscall.SIGINT) // immediate shutdown
				select {
				case <-b.done:
				case <-time.After(10 * time.Second):
					_ = proc.Kill()
					<-b.done
				}
				b.mu.Lock()
				restarts := b.restarts
				b.mu.Unlock()
				if restarts > 0 {
					t.Logf("pgbouncer exited by itself and was restarted %d times", restarts)
				}
				if t.Failed() || restarts > 0 {
					t.Logf("pgbouncer's log:\n%s", b.out.String())
				}
			})
			return b
		}
		_ = b.cmd.Process.Kill()
		<-exited
		if attempt == 4 { // the port was taken between freePort and the bind, five times
			t.Fatalf("pgbouncer did not start:\n%s", b.out.String())
		}
	}
}

// start starts the pooler (b.mu held or not yet shared); the channel is
// closed when it exits.
func (b *Bouncer) start() (<-chan struct{}, error) {
	cmd := exec.Command(b.bin, b.args...)
	cmd.Stdout, cmd.Stderr = b.out, b.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	b.cmd = cmd
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	return exited, nil
}

// supervise restarts the pooler, on the same port and configuration,
// whenever it exits while the test still runs (at most 5 times).
func (b *Bouncer) supervise(exited <-chan struct{}) {
	defer close(b.done)
	for {
		<-exited
		b.mu.Lock()
		if b.stopping || b.restarts == 5 {
			b.mu.Unlock()
			return
		}
		b.restarts++
		fmt.Fprintf(b.out, "--- pgbouncer exited by itself; the test kit restarts it ---\n")
		var err error
		exited, err = b.start()
		b.mu.Unlock()
		if err != nil {
			fmt.Fprintf(b.out, "--- restarting pgbouncer: %v ---\n", err)
			return
		}
	}
}

// ready waits until the pooler answers a query.
func (b *Bouncer) ready(exited <-chan struct{}) bool {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return false
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := pgx.Connect(ctx, b.URL(""))
		if err == nil {
			err = c.Ping(ctx)
			_ = c.Close(ctx)
		}
		cancel()
		if err == nil {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// URL is DATABASE_URL pointed at the pooler, without search_path or
// options, plus query (a=b&c=d, may be empty).
func (b *Bouncer) URL(query string) string {
	u := *b.base
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port))
	q := u.Query()
	q.Del("search_path")
	q.Del("options")
	extra, _ := url.ParseQuery(query)
	for k, v := range extra {
		q[k] = v
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// Repoint moves the pooler to the Postgres at addr (host:port), as a team
// does after a failover: it rewrites the [databases] section and has
// PgBouncer reload it (SIGHUP). PgBouncer closes each server connection to
// the old server once it is released; the client connections stay. It
// returns once a new transaction through the pooler runs on addr.
func (b *Bouncer) Repoint(t testing.TB, addr string) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("pgbouncer: repoint to %q: %v", addr, err)
	}
	b.mu.Lock()
	err = os.WriteFile(b.conf, []byte(fmt.Sprintf(b.tmpl, databases(host, port))), 0o644)
	b.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	proc := b.cmd.Process
	b.mu.Unlock()
	if err := proc.Signal(syscall.SIGHUP); err != nil {
		t.Fatalf("pgbouncer: reload: %v", err)
	}
	want, _ := strconv.Atoi(port)
	deadline := time.Now().Add(30 * time.Second)
	var got int
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		c, err := pgx.Connect(ctx, b.URL("default_query_exec_mode=exec"))
		if err == nil {
			err = c.QueryRow(ctx, "SELECT inet_server_port()").Scan(&got)
			_ = c.Close(ctx)
		}
		cancel()
		if err == nil && got == want {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("pgbouncer: still not on %s 30s after the reload (last port %d)\n%s", addr, got, b.Log())
}

// databases is the [databases] section: every database on host:port.
func databases(host, port string) string {
	return fmt.Sprintf("* = host=%s port=%s\n", host, port)
}

// Stats are PgBouncer's counters for one database (SHOW STATS): what went
// through the pooler since it started.
type Stats struct {
	Xacts, Queries int64 // transactions, and statements (each a round trip to the server)
}

// Stats reads the counters of database db from PgBouncer's admin console.
// PgBouncer folds its counters into them every second (stats_period): it
// waits that long first.
func (b *Bouncer) Stats(t testing.TB, db string) Stats {
	t.Helper()
	time.Sleep(1100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	u := *b.base
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port))
	u.Path = "/pgbouncer"
	u.RawQuery = "sslmode=disable&default_query_exec_mode=simple_protocol"
	c, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatalf("pgbouncer admin console: %v", err)
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, "SHOW STATS")
	if err != nil {
		t.Fatalf("SHOW STATS: %v", err)
	}
	defer rows.Close()
	var st Stats
	for rows.Next() {
		row := map[string]string{}
		for i, f := range rows.FieldDescriptions() {
			row[f.Name] = string(rows.RawValues()[i]) // text: the admin console speaks the simple protocol
		}
		if row["database"] != db {
			continue
		}
		st.Xacts, _ = strconv.ParseInt(row["total_xact_count"], 10, 64)
		st.Queries, _ = strconv.ParseInt(row["total_query_count"], 10, 64)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("SHOW STATS: %v", err)
	}
	return st
}

// Log is what PgBouncer wrote so far.
func (b *Bouncer) Log() string { return b.out.String() }

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Clone(s.b.String())
}

// Kill ends the pooler with SIGKILL, as a crash would; the kit restarts it.
func (b *Bouncer) Kill() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cmd.Process.Kill()
}

// Restarts is how many times the kit restarted a pooler that exited.
func (b *Bouncer) Restarts() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.restarts
}
