package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// bins holds the binaries built once by TestMain.
var bins = map[string]string{}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pelguard-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	for _, b := range []string{"consumer", "reaper", "auditor", "console"} {
		out := filepath.Join(dir, b)
		args := []string{"build", "-o", out}
		if soakBuild {
			args = append(args, "-tags", "pelguard_soak")
		}
		if msg, err := exec.Command("go", append(args, "github.com/pelguard/pelguard/cmd/"+b)...).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building %s: %v\n%s", b, err, msg)
			os.Exit(2)
		}
		bins[b] = out
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// The planted secrets. Each carries the marker, so one scan finds any of
// them, and each also looks exactly like what production would hold.
const (
	marker         = "e2eSECRET"
	testKey        = "sk_test_" + marker + "stripe0001"
	liveKey        = "sk_live_" + marker + "stripe0002"
	restrictedKey  = "rk_test_" + marker + "restricted03"
	slackWebhook   = "https://hooks.slack.com/services/T0E2E0000/B0E2E0000/" + marker + "webhook04"
	slackBotToken  = "xoxb-111111111111-222222222222-" + marker + "bot05"
	dbPassword     = marker + "dbpw06"
	redisPassword  = marker + "redispw07"
	webhookSecret  = "whsec_" + marker + "hook08"
	deadProxy      = "http://127.0.0.1:1" // Slack posts fail at once instead of leaving the machine
	unreachableDB  = "postgres://billing:" + dbPassword + "@127.0.0.1:1/billing?sslmode=disable&connect_timeout=2"
	unreachableRDS = "redis://:" + redisPassword + "@127.0.0.1:1/0"
)

// withPassword puts dbPassword into a Postgres URL. The test server trusts
// local connections and ignores it, so the binary works and the password is
// in every connection string it handles.
func withPassword(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	user := "postgres"
	if u.User != nil && u.User.Username() != "" {
		user = u.User.Username()
	}
	u.User = url.UserPassword(user, dbPassword)
	return u.String()
}

// baseEnv is the test's environment without anything pelguard reads, plus a
// proxy that refuses connections so Slack is never really called (loopback,
// where the emulator listens, is never proxied).
func baseEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "STRIPE_"), strings.HasPrefix(k, "SLACK_"), strings.HasPrefix(k, "PELGUARD_"),
			k == "REDIS_URL", k == "DATABASE_URL", k == "LOG_FORMAT", k == "LOG_LEVEL",
			strings.EqualFold(k, "https_proxy"), strings.EqualFold(k, "http_proxy"), strings.EqualFold(k, "no_proxy"):
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "HTTPS_PROXY="+deadProxy, "HTTP_PROXY="+deadProxy)
	for _, kv := range extra {
		// A test database URL selects its schema with search_path; the
		// binaries name pelguard's schema themselves and must be told the same.
		if url, ok := strings.CutPrefix(kv, "DATABASE_URL="); ok && strings.Contains(url, "search_path=") {
			env = append(env, "PELGUARD_DB_SCHEMA="+testenv.SchemaOfURL(url))
		}
	}
	return append(env, extra...)
}

// syncBuffer collects what several goroutines write.
type syncBuffer = testenv.SyncBuffer

// result is one finished run of a binary.
type result struct {
	code int
	out  string // stdout and stderr, interleaved
}

// runBin runs a binary to completion (or kills it after timeout).
func runBin(t *testing.T, bin string, env []string, timeout time.Duration, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bins[bin], args...)
	cmd.Env = env
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok || ctx.Err() != nil {
			t.Fatalf("%s %v: %v\n%s", bin, args, err, out.String())
		}
		code = ee.ExitCode()
	}
	res := result{code: code, out: out.String()}
	assertNoSecret(t, bin+" "+strings.Join(args, " "), res.out)
	return res
}

// proc is a long-running binary.
type proc struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan error
	// exited is closed once the process has exited (after Wait, before
	// done is sent): stop reads it, never cmd.ProcessState, which Wait
	// writes on its own goroutine.
	exited chan struct{}
}

func startBin(t *testing.T, bin string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bins[bin], args...)
	cmd.Env = env
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, name: bin, cmd: cmd, out: out, done: make(chan error, 1), exited: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		close(p.exited)
		p.done <- err
	}()
	t.Cleanup(func() { p.stop() })
	return p
}

// stop sends SIGTERM, waits, and scans the output for secrets. Idempotent.
func (p *proc) stop() string {
	p.t.Helper()
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
			p.t.Errorf("%s did not stop after SIGTERM\n%s", p.name, p.out.String())
		}
		assertNoSecret(p.t, p.name, p.out.String())
	}
	return p.out.String()
}

var opsAddr = regexp.MustCompile(`serving /metrics, /healthz, /readyz"? addr=([0-9.:]+)`)

// addr waits for the ops server's log line and returns its address.
func (p *proc) addr() string {
	p.t.Helper()
	var a string
	testenv.Eventually(p.t, 30*time.Second, func() bool {
		if m := opsAddr.FindStringSubmatch(p.out.String()); m != nil {
			a = m[1]
			return true
		}
		select {
		case err := <-p.done:
			p.done <- err
			p.t.Fatalf("%s exited: %v\n%s", p.name, err, p.out.String())
		default:
		}
		return false
	}, "%s serves /metrics", p.name)
	return a
}

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

// assertNoSecret fails when any planted secret, or any part of one, shows.
func assertNoSecret(t *testing.T, what, out string) {
	t.Helper()
	for _, s := range []string{marker, testKey, liveKey, restrictedKey, slackWebhook, slackBotToken, dbPassword, redisPassword} {
		if strings.Contains(out, s) {
			i := strings.Index(out, s)
			lo, hi := max(0, i-200), min(len(out), i+len(s)+100)
			t.Errorf("%s printed a secret (%q):\n…%s…", what, s, out[lo:hi])
			return
		}
	}
}
