package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"regexp"
	"strings"
	"testing"

	"github.com/pelguard/pelguard/internal/cli/auditorcli"
	"github.com/pelguard/pelguard/internal/cli/consolecli"
	"github.com/pelguard/pelguard/internal/cli/consumercli"
	"github.com/pelguard/pelguard/internal/cli/reapercli"
)

type mainFunc func(ctx context.Context, args []string, stdout, stderr io.Writer) int

// programs are the four installed binaries, by their installed names.
var programs = []struct {
	name     string
	main     mainFunc
	commands []string
}{
	{"pelguard-consumer", consumercli.Main, []string{"run", "cap", "replay", "retry", "webhook", "import", "migrate"}},
	{"pelguard-reaper", reapercli.Main, []string{"run", "migrate"}},
	{"pelguard-auditor", auditorcli.Main, []string{"run", "refund", "findings", "resolve", "dismiss", "migrate"}},
	{"pelguard-console", consolecli.Main, []string{"serve", "hash-password", "migrate"}},
}

func run(main mainFunc, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := main(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// isolate points every dependency at a closed port and drops a Stripe key:
// on the code before the fix, a flag that was not refused goes on and
// fails elsewhere (a missing key, an unreachable database) instead of
// starting anything, and its message does not name the flag.
func isolate(t *testing.T) {
	t.Setenv("REDIS_URL", "redis://127.0.0.1:1/0")
	t.Setenv("DATABASE_URL", "postgres://u:p@127.0.0.1:1/db?sslmode=disable")
	t.Setenv("PELGUARD_WAIT_FOR_DEPS", "0s")
	t.Setenv("STRIPE_API_KEY", "")
	t.Setenv("LOG_FORMAT", "text")
}

// TestRefusesNonsense: an explicit 0 or empty value, or an environment
// variable set but empty, that would silently mean the default stops the
// program at start with exit 2 and a message naming the flag (or the
// variable). An empty namespace, above all, would change every
// idempotency key: charges the team made would be made again.
func TestRefusesNonsense(t *testing.T) {
	isolate(t)
	consumer, reaper, auditor, console := consumercli.Main, reapercli.Main, auditorcli.Main, consolecli.Main
	cases := []struct {
		main mainFunc
		env  map[string]string
		args []string
		want string // in the message
	}{
		// consumer run
		{consumer, nil, []string{"--workers", "0"}, "--workers 0"},
		{consumer, nil, []string{"--count", "0"}, "--count 0"},
		{consumer, nil, []string{"--block", "0s"}, "--block 0s"},
		{consumer, nil, []string{"--lease", "0s"}, "--lease 0s"},
		{consumer, nil, []string{"--safe-key-window", "0s"}, "--safe-key-window 0s"},
		{consumer, nil, []string{"--max-amount-cents", "0"}, "--max-amount-cents 0"},
		{consumer, nil, []string{"--dead-letter-alert-interval", "0s"}, "--dead-letter-alert-interval 0s"},
		{consumer, nil, []string{"--stripe-timeout", "0s"}, "--stripe-timeout 0s"},
		{consumer, nil, []string{"--namespace", ""}, "--namespace is empty"},
		{consumer, nil, []string{"--namespace", "  "}, "--namespace is empty"},
		{consumer, nil, []string{"--group", ""}, "--group is empty"},
		{consumer, nil, []string{"--stream", ""}, "--stream is empty"},
		{consumer, nil, []string{"--db-schema", ""}, "--db-schema is empty"},
		{consumer, nil, []string{"--charge-description", ""}, "--charge-description is empty"},
		{consumer, nil, []string{"--database-url", ""}, "--database-url is empty"},
		{consumer, nil, []string{"--redis-url", ""}, "--redis-url is empty"},
		{consumer, map[string]string{"PELGUARD_NAMESPACE": ""}, nil, "PELGUARD_NAMESPACE is set but empty"},
		{consumer, map[string]string{"PELGUARD_NAMESPACE": "  "}, nil, "PELGUARD_NAMESPACE is set but empty"},
		{consumer, map[string]string{"PELGUARD_GROUP": ""}, nil, "PELGUARD_GROUP is set but empty"},
		{consumer, map[string]string{"PELGUARD_STREAM": ""}, nil, "PELGUARD_STREAM is set but empty"},
		{consumer, map[string]string{"PELGUARD_DB_SCHEMA": ""}, nil, "PELGUARD_DB_SCHEMA is set but empty"},
		{consumer, map[string]string{"DATABASE_URL": ""}, nil, "DATABASE_URL is set but empty"},
		{consumer, map[string]string{"LOG_LEVEL": ""}, nil, "LOG_LEVEL is set but empty"},
		{consumer, map[string]string{"PELGUARD_DECLINE_RETRIES": "three"}, nil, `PELGUARD_DECLINE_RETRIES="three"`},
		{consumer, map[string]string{"PELGUARD_WAIT_FOR_DEPS": "soon"}, nil, `PELGUARD_WAIT_FOR_DEPS="soon"`},
		// consumer's other commands
		{consumer, nil, []string{"webhook", "--tolerance", "0s"}, "--tolerance 0s: want more than 0"},
		{consumer, nil, []string{"replay", "--group", ""}, "--group is empty"},
		{consumer, nil, []string{"import", "--from-table", "public.billing_records", "--namespace", ""}, "--namespace is empty"},
		{consumer, map[string]string{"PELGUARD_NAMESPACE": ""}, []string{"import", "--from-table", "public.billing_records"}, "PELGUARD_NAMESPACE is set but empty"},
		{consumer, nil, []string{"import", "--from-table", "public.billing_records", "--description", ""}, "--description is empty"},
		{consumer, nil, []string{"migrate", "status", "--db-schema", ""}, "--db-schema is empty"},
		{consumer, nil, []string{"cap", "show", "--db-schema", ""}, "--db-schema is empty"},
		// reaper run
		{reaper, nil, []string{"--workers", "0"}, "--workers 0"},
		{reaper, nil, []string{"--interval", "0s"}, "--interval 0s"},
		{reaper, nil, []string{"--page-size", "0"}, "--page-size 0"},
		{reaper, nil, []string{"--page-workers", "0"}, "--page-workers 0"},
		{reaper, nil, []string{"--max-deliveries", "0"}, "--max-deliveries 0"},
		{reaper, nil, []string{"--min-idle", "0s"}, "--min-idle 0s"},
		{reaper, nil, []string{"--lease", "0s"}, "--lease 0s"},
		{reaper, nil, []string{"--namespace", ""}, "--namespace is empty"},
		{reaper, map[string]string{"PELGUARD_NAMESPACE": ""}, nil, "PELGUARD_NAMESPACE is set but empty"},
		{reaper, map[string]string{"PELGUARD_MIN_IDLE": "5"}, nil, `PELGUARD_MIN_IDLE="5"`},
		// auditor
		{auditor, nil, []string{"--overlap", "0s"}, "--overlap 0s"},
		{auditor, nil, []string{"--initial-lookback", "0s"}, "--initial-lookback 0s"},
		{auditor, nil, []string{"--stuck-after", "0s"}, "--stuck-after 0s"},
		{auditor, nil, []string{"--stuck-processing-after", "0s"}, "--stuck-processing-after 0s"},
		{auditor, nil, []string{"--parallel", "0"}, "--parallel 0"},
		{auditor, nil, []string{"--max-refunds", "0"}, "--max-refunds 0"},
		{auditor, nil, []string{"--max-cents-24h", "0"}, "--max-cents-24h 0"},
		{auditor, nil, []string{"--legacy-pattern", ""}, "--legacy-pattern is empty"},
		{auditor, nil, []string{"findings", "--limit", "0"}, "--limit 0"},
		// console
		{console, nil, []string{"serve", "--shutdown-timeout", "0s"}, "--shutdown-timeout 0s"},
		{console, map[string]string{"PELGUARD_CONSOLE_LISTEN": ""}, []string{"serve"}, "PELGUARD_CONSOLE_LISTEN is set but empty"},
	}
	for _, c := range cases {
		for k, v := range c.env {
			t.Setenv(k, v)
		}
		code, _, stderr := run(c.main, c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v %v: exit %d, stderr:\n%s\nwant exit 2 naming %q", c.env, c.args, code, stderr, c.want)
		}
		isolate(t)
		for k := range c.env {
			if k != "REDIS_URL" && k != "DATABASE_URL" && k != "PELGUARD_WAIT_FOR_DEPS" {
				t.Setenv(k, "x") // restored by t.Setenv's cleanup; unset below
				unsetenv(t, k)
			}
		}
	}
}

// TestDocumentedZerosStay: a 0 or an empty value documented as "off",
// "never", "none" or "all" is still taken: these runs go past the flags
// and stop at what isolate took away (no Stripe key, no database).
func TestDocumentedZerosStay(t *testing.T) {
	isolate(t)
	for _, c := range []struct {
		main mainFunc
		args []string
	}{
		{consumercli.Main, []string{"--follow-up-every", "0s", "--decline-retries", "0", "--db-max-conns", "0", "--wait-for-deps", "0s",
			"--stripe-retries", "0", "--metrics-addr", "", "--name", ""}},
		{reapercli.Main, []string{"--consumer-idle", "0s", "--dry-run", "--metrics-addr", ""}},
		{consumercli.Main, []string{"replay", "--limit", "0"}},
		{consumercli.Main, []string{"cap", "set", "--period", "2026-11", "--cents", "0"}},
		{auditorcli.Main, []string{"--settle-delay", "0s", "--redis-url", ""}},
	} {
		code, _, stderr := run(c.main, c.args...)
		if strings.Contains(stderr, "want more than 0") || strings.Contains(stderr, "is empty") || strings.Contains(stderr, "set but empty") {
			t.Errorf("%v: refused a documented value (exit %d):\n%s", c.args, code, stderr)
		}
	}
}

// TestPeriodFlags: every flag taking a billing period refuses one that no
// event could carry, as the consumer dead-letters it.
func TestPeriodFlags(t *testing.T) {
	isolate(t)
	for _, c := range []struct {
		main mainFunc
		args []string
		want string
	}{
		{consumercli.Main, []string{"cap", "set", "--period", "2026-13", "--cents", "2500"}, "month 13"},
		{consumercli.Main, []string{"cap", "set", "--period", "2025-W53", "--cents", "2500"}, "W01 to W52"},
		{consumercli.Main, []string{"cap", "set", "--period", "2026-Q5", "--cents", "2500"}, "Q1 to Q4"},
		{consumercli.Main, []string{"cap", "set", "--period", "2026-11-31", "--cents", "2500"}, "not a real date"},
		{consumercli.Main, []string{"cap", "show", "--period", "2026-00"}, "month 00"},
		{consumercli.Main, []string{"retry", "--period", "2026-13"}, "month 13"},
		{consumercli.Main, []string{"import", "--from-table", "public.billing_records", "--period", "2026-13"}, "month 13"},
		{consumercli.Main, []string{"import", "--from-stripe", "--period", "2026-W48"}, "takes a month"},
		{auditorcli.Main, []string{"--period", "2026-13"}, "month 13"},
		{auditorcli.Main, []string{"--period", "2026-W48"}, "--from and --to"},
		{auditorcli.Main, []string{"findings", "--period", "2026-Q0"}, "Q1 to Q4"},
	} {
		code, _, stderr := run(c.main, c.args...)
		if code != 2 || !strings.Contains(stderr, "--period") || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr:\n%s\nwant exit 2 naming --period and %q", c.args, code, stderr, c.want)
		}
	}
}

// TestHelpPlaceholders: the word after each flag in --help is its type,
// never a backquoted word of its usage ("--db-schema migrate up").
func TestHelpPlaceholders(t *testing.T) {
	t.Parallel()
	flagLine := regexp.MustCompile(`^  --([a-z0-9-]+)(?: (.*))?$`)
	typeLike := map[string]bool{"": true, "string": true, "int": true, "uint": true, "float": true, "duration": true}
	for _, p := range programs {
		for _, cmd := range p.commands {
			code, stdout, _ := run(p.main, "help", cmd)
			if code != 0 {
				t.Errorf("%s help %s: exit %d", p.name, cmd, code)
			}
			n := 0
			_, flags, _ := strings.Cut(stdout, "\nFlags:\n") // the description may quote flags
			for line := range strings.SplitSeq(flags, "\n") {
				m := flagLine.FindStringSubmatch(line)
				if m == nil {
					continue
				}
				n++
				if !typeLike[m[2]] {
					t.Errorf("%s %s --help: --%s shows placeholder %q, want a type", p.name, cmd, m[1], m[2])
				}
			}
			if n == 0 && cmd != "hash-password" {
				t.Errorf("%s help %s: no flags listed:\n%s", p.name, cmd, stdout)
			}
		}
	}
}

// TestUnknownFlagShortUsage: a wrong flag prints the error, the synopsis
// and where the flags are (not the whole usage) and exits 2; --help still
// prints everything.
func TestUnknownFlagShortUsage(t *testing.T) {
	t.Parallel()
	for _, p := range programs {
		for _, args := range [][]string{{"--bogus"}, {p.commands[1], "--bogus"}} {
			if args[0] == "cap" || args[0] == "migrate" {
				args = []string{args[0], map[string]string{"cap": "show", "migrate": "status"}[args[0]], "--bogus"}
			}
			code, _, stderr := run(p.main, args...)
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			if code != 2 || len(lines) != 3 || !strings.Contains(lines[0], "unknown flag --bogus") ||
				!strings.HasPrefix(lines[1], "Usage: "+p.name) || !strings.Contains(lines[2], p.name) || !strings.Contains(lines[2], "--help") {
				t.Errorf("%s %v: exit %d, %d lines:\n%s", p.name, args, code, len(lines), stderr)
			}
		}
		code, _, stderr := run(p.main, "--help")
		if code != 0 || strings.Count(stderr, "\n") < 20 || !strings.Contains(stderr, "Usage: "+p.name) {
			t.Errorf("%s --help: exit %d:\n%s", p.name, code, stderr)
		}
	}
}

// TestErrorsReadOnce: an error a library reports ("consumer: --workers
// 300 …") is printed after the program's name once, not twice.
func TestErrorsReadOnce(t *testing.T) {
	isolate(t)
	t.Setenv("STRIPE_API_KEY", "sk_test_flags")
	t.Setenv("STRIPE_API_BASE", "http://127.0.0.1:1")
	for _, c := range []struct {
		main mainFunc
		prog string
		args []string
		want string
	}{
		{consumercli.Main, "pelguard-consumer", []string{"--workers", "300"}, "--workers 300 must be between 1 and 256"},
		{consumercli.Main, "pelguard-consumer", []string{"--count", "5000"}, "--count 5000 must be between 1 and 1000"},
		{reapercli.Main, "pelguard-reaper", []string{"--page-size", "20000"}, "--page-size 20000 must be between 1 and 10000"},
		{reapercli.Main, "pelguard-reaper", []string{"--page-workers", "100"}, "--page-workers 100 must be between 1 and 64"},
		{auditorcli.Main, "pelguard-auditor", []string{"--parallel", "100"}, "audit config: --parallel 100: want 1 to 64"},
	} {
		code, _, stderr := run(c.main, c.args...)
		if code != 2 || !strings.Contains(stderr, "\n"+c.prog+": "+c.want) {
			t.Errorf("%v: exit %d, stderr:\n%s\nwant a line %q", c.args, code, stderr, c.prog+": "+c.want+"…")
		}
		for _, lib := range []string{"consumer: ", "reaper: ", "audit: ", "auditor: "} {
			if strings.Contains(stderr, ": "+lib) {
				t.Errorf("%v: a doubled prefix %q in %q", c.args, lib, stderr)
			}
		}
	}
}

// TestFailJSON: under --log-format json (or LOG_FORMAT=json) a failed
// start's last line is a JSON log line, so a log pipeline parses every
// line; otherwise it stays plain text.
func TestFailJSON(t *testing.T) {
	isolate(t)
	check := func(name string, code int, stderr string, wantJSON bool) {
		t.Helper()
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		last := lines[len(lines)-1]
		var rec struct{ Level, Msg, Error, Command string }
		err := json.Unmarshal([]byte(last), &rec)
		switch {
		case code != 2:
			t.Errorf("%s: exit %d, want 2", name, code)
		case wantJSON && (err != nil || rec.Level != "ERROR" || rec.Msg == "" || !strings.Contains(rec.Error, "--workers 0") || rec.Command != "pelguard-consumer"):
			t.Errorf("%s: last line %q is not a JSON error record (%v)", name, last, err)
		case wantJSON && len(lines) != 1:
			t.Errorf("%s: %d lines, want the JSON line alone:\n%s", name, len(lines), stderr)
		case !wantJSON && err == nil:
			t.Errorf("%s: JSON without --log-format json: %q", name, last)
		}
	}
	code, _, stderr := run(consumercli.Main, "--log-format", "json", "--workers", "0")
	check("--log-format json", code, stderr, true)
	code, _, stderr = run(consumercli.Main, "--log-format=json", "--workers", "0")
	check("--log-format=json", code, stderr, true)
	code, _, stderr = run(consumercli.Main, "--workers", "0")
	check("text", code, stderr, false)
	t.Setenv("LOG_FORMAT", "json")
	code, _, stderr = run(consumercli.Main, "--workers", "0")
	check("LOG_FORMAT=json", code, stderr, true)
	code, _, stderr = run(consumercli.Main, "--log-format", "text", "--workers", "0")
	check("LOG_FORMAT=json --log-format text", code, stderr, false)
}
