package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pelguard/pelguard/chaos"
	"github.com/pelguard/pelguard/internal/testenv"
)

// TestMain doubles as the drill's killed child, as main does.
func TestMain(m *testing.M) {
	if code, ok := chaos.RunChildIfRequested(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

func args(extra ...string) []string {
	return append([]string{"--redis-url", testenv.RedisURL(), "--database-url", testenv.DatabaseURL(),
		"--events", "20", "--min-idle", "150ms"}, extra...)
}

func TestJSONAndHTML(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	page := filepath.Join(t.TempDir(), "report.html")
	code := run(context.Background(), args("--scenario", "expired-key", "--scenario", "partial-batch", "--json", "--html", page), &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var rows []map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &rows); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	if len(rows) != 4 || rows[0]["scenario"] != "partial-batch" || rows[0]["mode"] != "naive" || rows[3]["scenario"] != "expired-key" {
		t.Fatalf("rows %v", rows)
	}
	if !strings.Contains(stderr.String(), "[1/4] partial-batch / naive") || !strings.Contains(stderr.String(), "verdicts hold") {
		t.Errorf("no progress or verdict on stderr: %s", stderr.String())
	}
	h, err := os.ReadFile(page)
	if err != nil || !bytes.Contains(h, []byte("<svg")) {
		t.Fatalf("HTML report: %v", err)
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, a := range [][]string{
		{"--scenario", "nope"},
		{"--events", "3"},
		{"--bogus"},
		{"extra"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), args(a...), &stdout, &stderr); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", a, code, stderr.String())
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"--help"}, &stdout, &stderr); code != 0 ||
		!strings.Contains(stderr.String(), "aof-rollback") {
		t.Errorf("--help: exit %d: %s", code, stderr.String())
	}
}

// A dead Redis is an error (exit 2) that says what to check, not a verdict.
func TestUnreachableRedis(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"--redis-url", "redis://127.0.0.1:1/0", "--database-url", testenv.DatabaseURL()}, &stdout, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "Redis") {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
}

// Without redis-server, aof-rollback is skipped with a visible note and the
// other scenarios still decide the exit status.
func TestMissingRedisServerSkipsAOFRollback(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // no redis-server; not parallel: it changes the environment
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args("--scenario", "aof-rollback", "--scenario", "expired-key"), &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for _, w := range []string{stdout.String(), stderr.String()} {
		if !strings.Contains(w, "SKIPPED aof-rollback: redis-server is not installed") {
			t.Errorf("no visible skip note in %q", w)
		}
	}
	if !strings.Contains(stdout.String(), "expired-key") || strings.Contains(stdout.String(), "aof-rollback     naive") {
		t.Errorf("table:\n%s", stdout.String())
	}
}
