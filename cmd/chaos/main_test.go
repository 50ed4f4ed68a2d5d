package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/chaos"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
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
	code := run(context.Background(), args("--scenario", "usage-25h-gap", "--scenario", "expired-key", "--scenario", "partial-batch",
		"--json", "--html", page), &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "the HTML report (chart, table, each scenario explained): "+page) {
		t.Errorf("stderr does not say where the report is:\n%s", stderr.String())
	}
	var out struct {
		Charges []map[string]any `json:"charges"`
		Usage   []map[string]any `json:"usage"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	rows := out.Charges
	if len(rows) != 4 || rows[0]["scenario"] != "partial-batch" || rows[0]["mode"] != "naive" || rows[3]["scenario"] != "expired-key" {
		t.Fatalf("rows %v", rows)
	}
	u := out.Usage
	if len(u) != 3 || u[0]["scenario"] != "usage-25h-gap" || u[1]["mode"] != "naive-identifier" || u[2]["mode"] != "pelguard" ||
		u[0]["overcount_units"].(float64) == 0 || u[2]["overcount_units"].(float64) != 0 {
		t.Fatalf("usage rows %v", u)
	}
	if !strings.Contains(stderr.String(), "[1/7] partial-batch / naive") || !strings.Contains(stderr.String(), "[7/7] usage-25h-gap / pelguard") ||
		!strings.Contains(stderr.String(), "verdicts hold") {
		t.Errorf("no progress or verdict on stderr: %s", stderr.String())
	}
	h, err := os.ReadFile(page)
	if err != nil || !bytes.Contains(h, []byte("<svg")) || !bytes.Contains(h, []byte("usage-25h-gap")) {
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
		!strings.Contains(stderr.String(), "aof-rollback") || !strings.Contains(stderr.String(), "usage-25h-gap") ||
		!strings.Contains(stderr.String(), "usage-busy-customer") {
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

// A cell that misses its deadline is a row marked FAILED in the table and
// the HTML report, the verdicts do not hold (no "Verdicts hold" anywhere)
// and the exit status is 2 (issue 25, item 9: the row used to be dropped
// and the HTML stayed green).
func TestMissedDeadlineIsReportedAsFailed(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	page := filepath.Join(t.TempDir(), "report.html")
	hooks := chaos.TestConfig{Deadline: func(cell string) time.Duration {
		if cell == "expired-key/pelguard" {
			return time.Nanosecond
		}
		return 0
	}}
	code := runWith(context.Background(), args("--scenario", "expired-key", "--html", page), &stdout, &stderr, hooks)
	if code == 0 {
		t.Fatalf("exit 0 with a cell past its deadline: %s", stderr.String())
	}
	table := stdout.String()
	t.Logf("exit %d\n%s%s", code, table, stderr.String())
	var row string
	for _, l := range strings.Split(table, "\n") {
		if strings.Contains(l, "expired-key") && strings.Contains(l, "pelguard") && !strings.HasPrefix(l, "FAILED") {
			row = l
		}
	}
	if !strings.HasSuffix(strings.TrimSpace(row), "FAILED") {
		t.Errorf("no pelguard row marked FAILED in the table:\n%s", table)
	}
	for _, w := range []string{"FAILED expired-key/pelguard: the scenario did not finish", "INCOMPLETE: the verdicts do not hold", "expired-key     naive"} {
		if !strings.Contains(table, w) {
			t.Errorf("table lacks %q:\n%s", w, table)
		}
	}
	if !strings.Contains(stderr.String(), "VERDICTS DO NOT HOLD") || strings.Contains(strings.ToLower(stderr.String()), "verdicts hold") {
		t.Errorf("stderr:\n%s", stderr.String())
	}
	h, err := os.ReadFile(page)
	if err != nil {
		t.Fatalf("HTML report: %v", err)
	}
	html := string(h)
	for _, w := range []string{"Verdicts do not hold: the run is incomplete", `class="pelguard failed"`, "FAILED: the scenario did not finish", "expired-key/pelguard: FAILED"} {
		if !strings.Contains(html, w) {
			t.Errorf("HTML lacks %q", w)
		}
	}
	if strings.Contains(html, "Verdicts hold") {
		t.Error("the HTML report of a failed run says the verdicts hold")
	}
}
