package refdocs

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// flagCase is one command of an installed binary and one of its flags.
type flagCase struct {
	bin, where string
	cmd        cli.Command
	verb       []string // a verb the flags follow: `cap set --cents …`
	flag       Flag
}

// everyFlag lists every flag of every command of the installed binaries,
// as each command's --help prints it.
func everyFlag(t *testing.T) []flagCase {
	t.Helper()
	var out []flagCase
	for _, bin := range binaries {
		for _, c := range bin.program().Commands {
			u, err := HelpOf(context.Background(), c)
			if err != nil {
				t.Fatal(err)
			}
			var verb []string
			if first, _, _ := strings.Cut(c.Args, " "); strings.Contains(first, "|") && !strings.ContainsAny(first, "-ABCDEFGHIJKLMNOPQRSTUVWXYZ") {
				verb = []string{strings.Split(first, "|")[0]}
			}
			for _, f := range u.Flags {
				out = append(out, flagCase{bin: bin.installed, where: strings.TrimSpace(bin.installed + " " + c.Name + " " + strings.Join(verb, " ")),
					cmd: c, verb: verb, flag: f})
			}
		}
	}
	return out
}

// noDeps leaves the environment without pelguard's variables and points
// every dependency at a closed port, so a command that gets past its flags
// stops at once, in its own words.
func noDeps(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "" && !keepEnv[k] {
			t.Setenv(k, "")
			_ = os.Unsetenv(k)
		}
	}
	t.Setenv("REDIS_URL", "redis://127.0.0.1:1/0")
	t.Setenv("DATABASE_URL", "postgres://u:p@127.0.0.1:1/db?sslmode=disable")
	// Listeners on ports of their own: the defaults (the reaper's 9465, the
	// console's, the webhook's) are the ones other packages' tests, run at
	// the same time, expect free.
	for _, k := range []string{"PELGUARD_METRICS_ADDR", "PELGUARD_REAPER_METRICS_ADDR", "PELGUARD_AUDITOR_METRICS_ADDR",
		"PELGUARD_CONSOLE_LISTEN", "PELGUARD_WEBHOOK_LISTEN"} {
		t.Setenv(k, "127.0.0.1:0")
	}
	t.Setenv("PELGUARD_WAIT_FOR_DEPS", "0s")
	t.Setenv("STRIPE_API_KEY", "sk_test_flagerrors")
	t.Setenv("STRIPE_API_BASE", "http://127.0.0.1:1")
}

// run runs the command with args for at most limit: a value that was taken
// starts the command, which stops at the closed ports or at limit.
func (fc flagCase) run(t *testing.T, limit time.Duration, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	// go-redis dials and logs on goroutines of its own: one buffer for
	// both streams must take concurrent writes.
	var out testenv.SyncBuffer
	code := fc.cmd.Run(ctx, append(append([]string{}, fc.verb...), args...), &out, &out)
	return code, out.String()
}

// TestFlagParseErrorsNameTheFlagAndTheFix: a value a flag cannot parse, a
// flag given without its value, a boolean given a word: each is refused
// with exit 2 by a message that names the flag as it is typed (--name, not
// the flag package's -name), the value, and what to give instead (never a
// bare "parse error"), for every flag of every command of every installed
// binary.
func TestFlagParseErrorsNameTheFlagAndTheFix(t *testing.T) {
	noDeps(t)
	cases := everyFlag(t)
	checked := 0
	for _, fc := range cases {
		name := "--" + fc.flag.Name
		var args []string
		var want []string
		switch fc.flag.Placeholder {
		case "int", "uint", "float", "duration":
			args, want = []string{name, "notanumber"}, []string{name + ` "notanumber": want a`}
		case "":
			args, want = []string{name + "=maybe"}, []string{name + `="maybe": want true or false`}
		default:
			continue // strings, lists: any text parses
		}
		checked++
		code, out := fc.run(t, 10*time.Second, args...)
		first, _, _ := strings.Cut(out, "\n")
		if code != cli.ExitError || strings.Contains(out, "parse error") || strings.Contains(out, " -"+fc.flag.Name) {
			t.Errorf("%s %s: exit %d, want 2 and the flag as typed, without \"parse error\":\n%s", fc.where, strings.Join(args, " "), code, out)
			continue
		}
		for _, w := range want {
			if !strings.Contains(first, w) {
				t.Errorf("%s %s: %q lacks %q", fc.where, strings.Join(args, " "), first, w)
			}
		}
		if fc.flag.Placeholder != "" {
			// Last, without its value.
			code, out := fc.run(t, 10*time.Second, name)
			first, _, _ := strings.Cut(out, "\n")
			if code != cli.ExitError || !strings.Contains(first, name+" needs a value: a ") {
				t.Errorf("%s %s (no value): exit %d, %q: want %q", fc.where, name, code, first, name+" needs a value: a …")
			}
		}
	}
	if checked < 200 {
		t.Fatalf("only %d typed flags checked across %d: the walk over the binaries' flags is broken", checked, len(cases))
	}
}

// goField matches what a Go programmer names and an operator never typed:
// a struct field path (Usage.SettleDelay, Config.Writer) or a CamelCase
// identifier (SettleDelay, MeterEventLatency).
var goField = regexp.MustCompile(`\b(?:[A-Z][A-Za-z0-9]*\.[A-Z][A-Za-z0-9]*|[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+)\b`)

// notGoFields are CamelCase words that are names an operator knows.
var notGoFields = map[string]bool{"PaymentIntents": true, "PaymentIntent": true, "PgBouncer": true, "OpenTelemetry": true, "PostgreSQL": true}

// TestFlagErrorsNameNoStructField: every number and duration flag of every
// command, given a negative value and a very large one, is either taken or
// refused in the words the operator typed (the flag), never by the Go
// field behind it ("Usage.SettleDelay (--usage-settle-delay) must be below
// 24h", "Parallel (--parallel) must be between 1 and 64").
func TestFlagErrorsNameNoStructField(t *testing.T) {
	noDeps(t)
	checked := 0
	for _, fc := range everyFlag(t) {
		var values []string
		switch fc.flag.Placeholder {
		case "int", "uint", "float":
			values = []string{"-1", "1000000000"}
		case "duration":
			values = []string{"-1s", "1000000h"}
		default:
			continue
		}
		for _, v := range values {
			checked++
			code, out := fc.run(t, 500*time.Millisecond, "--"+fc.flag.Name, v)
			for _, m := range goField.FindAllString(out, -1) {
				if !notGoFields[m] && !strings.ContainsFunc(m, unicode.IsSpace) {
					t.Errorf("%s --%s %s: exit %d names %q, a Go field, not what was typed:\n%s", fc.where, fc.flag.Name, v, code, m, out)
					break
				}
			}
		}
	}
	if checked < 300 {
		t.Fatalf("only %d values tried: the walk over the binaries' flags is broken", checked)
	}
}
