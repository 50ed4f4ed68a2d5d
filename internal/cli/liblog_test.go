package cli_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/cli/consumercli"
)

const liblogChild = "PELGUARD_TEST_LIBLOG_CHILD"

// A consumer started with --log-format json against a Redis that refuses
// connections writes only JSON lines to its stderr: go-redis's own dial
// errors (which it prints itself, as plain text, unless routed) arrive as
// JSON too. The consumer runs in a child process (this test binary,
// re-executed) because go-redis writes to the process's stderr, not to the
// writer Main is given.
func TestLogsAreJSONLines(t *testing.T) {
	if os.Getenv(liblogChild) == "1" {
		os.Exit(consumercli.Main(context.Background(), os.Args[len(os.Args)-1:], os.Stdout, os.Stderr))
	}
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := l.Addr().String()
	_ = l.Close()

	cmd := exec.Command(os.Args[0], "-test.run=^TestLogsAreJSONLines$", "--")
	// The consumer's flags come from the environment, so that the test
	// binary's own flag parsing leaves them alone.
	cmd.Env = append(os.Environ(), liblogChild+"=1",
		"REDIS_URL=redis://"+refused+"/0",
		"DATABASE_URL=postgres://pelguard@"+refused+"/pelguard?sslmode=disable",
		"STRIPE_API_KEY=sk_test_LibLogNeverPrinted0123456789",
		"LOG_FORMAT=json", "PELGUARD_WAIT_FOR_DEPS=1s")
	cmd.Args = append(cmd.Args, "--metrics-addr=127.0.0.1:0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	if code := cmd.ProcessState.ExitCode(); code != cli.ExitUnavailable {
		t.Fatalf("exit %d (%v), want %d (Redis unavailable)\n%s", code, err, cli.ExitUnavailable, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	// The last line is cli.Fail's exit message ("Redis at … did not
	// answer …"): under LOG_FORMAT=json a JSON line like the others.
	if last := lines[len(lines)-1]; !strings.Contains(last, `"level":"ERROR"`) || !strings.Contains(last, `"exit_code":3`) {
		t.Errorf("the exit message is not a JSON error line: %s", last)
	}
	fromRedis := 0
	for _, line := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("a stderr line is not JSON (%v): %s", err, line)
			continue
		}
		if rec["library"] == "go-redis" && strings.Contains(fmt.Sprint(rec["msg"]), "failed to dial") {
			fromRedis++
		}
	}
	if fromRedis == 0 {
		t.Errorf("no go-redis dial error among the JSON lines:\n%s", stderr.String())
	}
	if strings.Contains(stderr.String(), "LibLogNeverPrinted") {
		t.Errorf("the Stripe key in the logs:\n%s", stderr.String())
	}
}

// The wait for a dependency logs retry_in (and waited) as a duration a
// person reads, "250ms", not 250000000 (slog.Duration in JSON).
func TestWaitLogsDurationsAsText(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	logger, err := (&cli.Logging{Format: "json", Level: "info"}).Logger(&buf)
	if err != nil {
		t.Fatal(err)
	}
	tries := 0
	dep := cli.Dep{Name: "Redis", Addr: "127.0.0.1:1", Env: "REDIS_URL", Ping: func(context.Context) error {
		if tries++; tries < 2 {
			return errors.New("connection refused")
		}
		return nil
	}}
	if err := (cli.Waiter{For: 5 * time.Second, Logger: logger}).Wait(context.Background(), dep); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"retry_in": "250ms", "waited": ""}
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("not JSON (%v): %s", err, line)
		}
		for k, w := range want {
			v, ok := rec[k]
			if !ok {
				continue
			}
			s, isText := v.(string)
			if _, perr := time.ParseDuration(s); !isText || perr != nil || (w != "" && s != w) {
				t.Errorf("%s = %v (%T), want a duration as text like %q: %s", k, v, v, cmp.Or(w, "252ms"), line)
			}
			delete(want, k)
		}
	}
	if len(want) > 0 {
		t.Errorf("no %v in the wait's log:\n%s", want, buf.String())
	}
}

// Every duration a command logs reads as text ("1m30s"), whoever logged
// it, not as slog's nanoseconds.
func TestLoggedDurationsAreText(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	log, err := (&cli.Logging{Format: "json", Level: "info"}).Logger(&b)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("x", slog.Duration("elapsed", 90*time.Second))
	if !strings.Contains(b.String(), `"elapsed":"1m30s"`) {
		t.Fatalf("duration logged as %s", b.String())
	}
}

// TestFailDoesNotDoubleThePrefix: "chaos: chaos: …" and
// "pelguard-consumer: consumer: …" read as one prefix.
func TestFailDoesNotDoubleThePrefix(t *testing.T) {
	for _, c := range []struct{ prog, err, want string }{
		{"chaos", "chaos: chaos: the drill needs Redis", "chaos: the drill needs Redis\n"},
		{"pelguard-consumer cap set", "consumer: no such period", "pelguard-consumer cap set: no such period\n"},
		{"pelguard-auditor", "audit config: bad", "pelguard-auditor: audit config: bad\n"},
	} {
		var b strings.Builder
		cli.Fail(&b, c.prog, errors.New(c.err))
		if b.String() != c.want {
			t.Errorf("Fail(%q, %q) printed %q, want %q", c.prog, c.err, b.String(), c.want)
		}
	}
}
