package consumercli

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

const testKey = "sk_test_DoNotPrintMe0123456789"

// dbPassword is put into DATABASE_URL (the test server trusts local
// connections and ignores it): the wait's log lines must never show it.
const dbPassword = "waitForMePw0451"

// syncBuffer collects what several goroutines write.
type syncBuffer = testenv.SyncBuffer

var opsAddr = regexp.MustCompile(`serving /metrics, /healthz, /readyz"? addr=([0-9.:]+)`)

func get(t *testing.T, u string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil}}
	resp, err := c.Get(u)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// freeAddr returns a loopback address nothing listens on (yet): a
// connection to it is refused, as to a Postgres that is not up.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// relayLater starts forwarding addr to target after delay: Postgres
// "comes up" at addr then.
func relayLater(t *testing.T, addr, target string, delay time.Duration) {
	t.Helper()
	var (
		mu sync.Mutex
		ln net.Listener
	)
	timer := time.AfterFunc(delay, func() {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("listening on %s: %v", addr, err)
			return
		}
		mu.Lock()
		ln = l
		mu.Unlock()
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
			go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
		}
	})
	t.Cleanup(func() {
		timer.Stop()
		mu.Lock()
		defer mu.Unlock()
		if ln != nil {
			_ = ln.Close()
		}
	})
}

// withHost returns raw with its host replaced and dbPassword as password.
func withHost(t *testing.T, raw, host string) (string, string) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	user := "postgres"
	if u.User != nil && u.User.Username() != "" {
		user = u.User.Username()
	}
	u.User, u.Host = url.UserPassword(user, dbPassword), host
	return u.String(), target
}

// Started while Postgres is unreachable (nothing listens on its address for
// the first 5 s), the consumer waits — one log line per failed try, without
// the password; /healthz up, /readyz "starting" — then runs, bills the
// event once, exports pelguard_build_info, and stops cleanly.
func TestWaitsForPostgresThenBills(t *testing.T) {
	t.Parallel()
	_, realURL := testenv.DBWithURL(t)
	addr := freeAddr(t)
	dbURL, target := withHost(t, realURL, addr)
	const downFor = 5 * time.Second
	relayLater(t, addr, target, downFor)
	upAt := time.Now().Add(downFor)

	rdb := testenv.Redis(t)
	stream := testenv.Name(t, "billing")
	testenv.CleanupKeys(t, rdb, stream, stream+":dead")
	ev := event.Event{CustomerID: "c_late", StripeCustomerID: "cus_1", AmountCents: 2500, BillingPeriod: "2026-11", Currency: "usd"}
	if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: map[string]any{"payload": ev.Payload()}}).Err(); err != nil {
		t.Fatal(err)
	}
	sim := stripesim.MustNew(stripesim.Config{})
	t.Cleanup(sim.Close)

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var out, logs syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"--stream", stream, "--redis-url", testenv.RedisURL(), "--database-url", dbURL, "--db-schema", testenv.SchemaOfURL(dbURL),
			"--stripe-key", testKey, "--stripe-api-base", sim.URL(), "--metrics-addr", "127.0.0.1:0", "--block", "100ms",
			"--wait-for-deps", "30s"}, &out, &logs)
	}()
	var ops string
	testenv.Eventually(t, 10*time.Second, func() bool {
		m := opsAddr.FindStringSubmatch(logs.String())
		if m != nil {
			ops = "http://" + m[1]
		}
		return m != nil && strings.Contains(logs.String(), "waiting for Postgres")
	}, "serving /healthz while waiting:\n%s", &logs)
	if code, _ := get(t, ops+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz %d while waiting: the process is up", code)
	}
	if code, body := get(t, ops+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "starting: not ready") {
		t.Errorf("/readyz %d %q while waiting, want 503 starting", code, body)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return sim.SucceededCharges("c_late", "2026-11") == 1 },
		"the event billed once Postgres is up:\n%s", &logs)
	if now := time.Now(); now.Before(upAt) {
		t.Fatalf("billed at %s, before Postgres was up at %s", now, upAt)
	}
	if code, body := get(t, ops+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz %d %q once running", code, body)
	}
	if _, body := get(t, ops+"/metrics"); !regexp.MustCompile(`pelguard_build_info\{[^}]*role="consumer"[^}]*\} 1`).MatchString(body) {
		t.Errorf("no pelguard_build_info for the consumer role on /metrics")
	}
	stop()
	select {
	case code := <-done:
		if code != cli.ExitOK {
			t.Fatalf("exit %d\n%s", code, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("did not stop\n%s", logs.String())
	}
	s := logs.String()
	if n := strings.Count(s, "waiting for Postgres"); n < 2 {
		t.Errorf("%d 'waiting for Postgres' lines, want one per failed try over %s:\n%s", n, downFor, s)
	}
	for _, want := range []string{"addr=" + addr, "try=1 ", "try=2 ", "retry_in=", "Postgres answers"} {
		if !strings.Contains(s, want) {
			t.Errorf("logs lack %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, dbPassword) || strings.Contains(s, testKey) {
		t.Errorf("a secret in the logs:\n%s", s)
	}
	if n := sim.SucceededCharges("c_late", "2026-11"); n != 1 {
		t.Errorf("%d charges, want 1", n)
	}
}

// Still unreachable after --wait-for-deps: exit 3 (ExitUnavailable), a
// message naming the dependency and the wait, no password. SIGTERM while
// waiting: exit 0 at once.
func TestUnreachableAfterWaitExit3(t *testing.T) {
	t.Parallel()
	dbURL, _ := withHost(t, testenv.DatabaseURL(), freeAddr(t))
	redisURL := "redis://:" + dbPassword + "@" + freeAddr(t) + "/0"
	base := []string{"--stripe-key", testKey, "--metrics-addr", "", "--wait-for-deps", "3s"}
	for _, tc := range []struct {
		name string
		args []string
		dep  string
	}{
		{"postgres", append([]string{"--database-url", dbURL, "--redis-url", testenv.RedisURL()}, base...), "Postgres"},
		{"redis", append([]string{"--database-url", testenv.DatabaseURL(), "--redis-url", redisURL}, base...), "Redis"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			code, _, errb := call(context.Background(), tc.args...)
			if code != cli.ExitUnavailable {
				t.Fatalf("exit %d, want %d\n%s", code, cli.ExitUnavailable, errb)
			}
			if !strings.Contains(errb, "pelguard-consumer: "+tc.dep+" at 127.0.0.1:") || !strings.Contains(errb, "within --wait-for-deps 3s") ||
				!strings.Contains(errb, "waiting for "+tc.dep) {
				t.Errorf("output:\n%s", errb)
			}
			if strings.Contains(errb, dbPassword) {
				t.Errorf("the password in the output:\n%s", errb)
			}
			if d := time.Since(start); d > 15*time.Second {
				t.Errorf("took %s with --wait-for-deps 3s", d)
			}
		})
	}
	t.Run("sigterm while waiting", func(t *testing.T) {
		t.Parallel()
		ctx, stop := context.WithCancel(context.Background())
		var logs syncBuffer
		done := make(chan int, 1)
		go func() {
			done <- Main(ctx, []string{"--database-url", dbURL, "--redis-url", testenv.RedisURL(), "--stripe-key", testKey,
				"--metrics-addr", "", "--wait-for-deps", "1m"}, io.Discard, &logs)
		}()
		testenv.Eventually(t, 10*time.Second, func() bool { return strings.Contains(logs.String(), "waiting for Postgres") },
			"waiting")
		stop()
		select {
		case code := <-done:
			if code != cli.ExitOK {
				t.Fatalf("exit %d\n%s", code, logs.String())
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("still waiting after SIGTERM\n%s", logs.String())
		}
	})
}

// A configuration error exits 2 at once, however long --wait-for-deps is:
// a database that does not exist (Postgres answered: no retry helps), a
// consumer setting the library refuses (checked before any connection).
func TestConfigErrorExit2WithoutWaiting(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testenv.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/no_such_db_" + testenv.Suffix()
	unreachable, _ := withHost(t, testenv.DatabaseURL(), freeAddr(t))
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"missing database": {[]string{"--database-url", u.String()}, "does not exist"},
		"bad --workers":    {[]string{"--database-url", unreachable, "--workers", "300"}, "--workers 300"},
		"bad --wait":       {[]string{"--wait-for-deps", "-1s"}, "--wait-for-deps"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			args := append([]string{"--redis-url", testenv.RedisURL(), "--stripe-key", testKey, "--metrics-addr", "",
				"--wait-for-deps", "1m"}, tc.args...)
			code, _, errb := call(context.Background(), args...)
			if code != cli.ExitError || !strings.Contains(errb, tc.want) {
				t.Fatalf("exit %d, want 2 and %q:\n%s", code, tc.want, errb)
			}
			if strings.Contains(errb, "waiting for") {
				t.Errorf("retried a configuration error:\n%s", errb)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("took %s", d)
			}
		})
	}
}
