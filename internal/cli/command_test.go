package cli

import (
	"bytes"
	"context"
	"flag"
	"io"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/version"
)

// testProgram has a default command with flags and a command with verbs.
func testProgram(ran *[]string) *Program {
	p := &Program{Name: "tool"}
	p.Commands = []Command{
		{Name: "run", Summary: "the default", Run: func(_ context.Context, args []string, _, stderr io.Writer) int {
			fs := NewFlagSet("tool", "tool [run] [flags]", "Runs.\n\n"+p.CommandList(), stderr)
			fs.Bool("x", false, "a flag")
			if err := Parse(fs, args); err != nil {
				return Fail(stderr, "tool", err)
			}
			*ran = append(*ran, "run "+strings.Join(args, " "))
			return ExitOK
		}},
		{Name: "cap", Args: "set|show", Summary: "verbs", Run: func(_ context.Context, args []string, _, stderr io.Writer) int {
			fs := NewFlagSet("tool cap", "tool cap set|show", "Caps.", stderr)
			verb, _, err := SplitVerb(fs, args, "set", "show")
			if err != nil {
				return Fail(stderr, "tool cap", err)
			}
			*ran = append(*ran, "cap "+verb)
			return ExitOK
		}},
	}
	return p
}

func TestProgramDispatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args           []string
		code           int
		ran            string
		stdout, stderr string // substrings
	}{
		{nil, 0, "run ", "", ""},
		{[]string{"-x"}, 0, "run -x", "", ""},
		{[]string{"run", "-x"}, 0, "run -x", "", ""},
		{[]string{"--help"}, 0, "", "", "Commands:\n  run (default)"},
		{[]string{"help"}, 0, "", "  cap set|show", ""},
		{[]string{"help", "cap"}, 0, "", "Usage: tool cap set|show", ""},
		{[]string{"help", "nope"}, 2, "", "", `unknown command "nope": want run, cap, help or version`},
		{[]string{"nope"}, 2, "", "", "Run 'tool --help' for the flags."},
		{[]string{"cap", "set"}, 0, "cap set", "", ""},
		{[]string{"cap", "--help"}, 0, "", "", "Usage: tool cap set|show"},
		{[]string{"cap", "-h"}, 0, "", "", "Usage: tool cap set|show"},
		{[]string{"cap"}, 2, "", "", "cap needs a command: set or show"},
		{[]string{"cap", "sideways"}, 2, "", "", `unknown cap command "sideways": want set or show`},
		{[]string{"version"}, 0, "", "tool " + version.Get().Version, ""},
		{[]string{"--version"}, 0, "", "tool " + version.Get().Version, ""},
	} {
		var ran []string
		var out, errb bytes.Buffer
		code := testProgram(&ran).Main(context.Background(), tc.args, &out, &errb)
		if code != tc.code || strings.Join(ran, ";") != tc.ran || !strings.Contains(out.String(), tc.stdout) ||
			!strings.Contains(errb.String(), tc.stderr) {
			t.Errorf("%v: exit %d, ran %q\nstdout:\n%s\nstderr:\n%s", tc.args, code, ran, out.String(), errb.String())
		}
	}
}

// Defaults are shown, redacted by the marker of the flag, not by its name:
// a "key" in a flag name no longer hides a duration, and a secret flag's
// default never shows, whatever it looks like.
func TestUsageDefaults(t *testing.T) {
	t.Parallel()
	var errb bytes.Buffer
	fs := NewFlagSet("tool", "tool", "", &errb)
	var secret, plain, dbURL string
	SecretVar(fs, &secret, "api-token", "opaque-value-matching-no-pattern", "a secret")
	fs.Duration("safe-key-window", 23*time.Hour, "not a secret")
	fs.Bool("allow-unrestricted-key", false, "not a secret either")
	fs.StringVar(&plain, "note", "sk_test_pastedIntoTheWrongFlag1", "a plain flag holding a key by mistake")
	fs.StringVar(&dbURL, "database-url", "postgres://u:pw123456@h:5432/db", "a URL")
	fs.Usage()
	s := errb.String()
	for _, want := range []string{"--api-token string", "(default [REDACTED])", "(default 23h0m0s)", "(default postgres://u:[REDACTED]@h:5432/db)"} {
		if !strings.Contains(s, want) {
			t.Errorf("usage lacks %q:\n%s", want, s)
		}
	}
	for _, leak := range []string{"opaque-value", "sk_test_pasted", "pw123456"} {
		if strings.Contains(s, leak) {
			t.Errorf("usage shows %q:\n%s", leak, s)
		}
	}
	// The marker does not change the value the flag holds.
	if err := fs.Parse([]string{"--api-token", "t2"}); err != nil || secret != "t2" {
		t.Fatalf("parsed %q, %v", secret, err)
	}
	var f flag.Value = fs.Lookup("api-token").Value
	if f.String() != "t2" {
		t.Fatalf("String() = %q", f.String())
	}
}

// The shared Stripe and Slack flags are the secret ones; a Stripe key from
// the environment that matches no pattern still never shows. Not parallel:
// it sets the environment.
func TestSecretFlagsOfEveryBinary(t *testing.T) {
	t.Setenv("STRIPE_API_KEY", "opaque-stripe-key-value")
	var errb bytes.Buffer
	fs := NewFlagSet("tool", "tool", "", &errb)
	var s Stripe
	var sl Slack
	s.Register(fs)
	sl.Register(fs)
	for _, name := range []string{"stripe-key", "slack-webhook-url", "slack-bot-token"} {
		if _, ok := fs.Lookup(name).Value.(*secretValue); !ok {
			t.Errorf("--%s is not marked secret", name)
		}
	}
	fs.Usage()
	if strings.Contains(errb.String(), "opaque-stripe-key-value") || !strings.Contains(errb.String(), "(default [REDACTED])") {
		t.Errorf("usage:\n%s", errb.String())
	}
	if s.APIKey != "opaque-stripe-key-value" {
		t.Errorf("APIKey = %q", s.APIKey)
	}
}

func TestBuildInfoMetric(t *testing.T) {
	t.Parallel()
	mfs, err := NewRegistry("reaper").Gather()
	if err != nil {
		t.Fatal(err)
	}
	v := version.Get()
	want := map[string]string{"goversion": v.GoVersion, "revision": v.Revision, "role": "reaper", "version": v.Version}
	for _, mf := range mfs {
		if mf.GetName() != "pelguard_build_info" {
			continue
		}
		if len(mf.GetMetric()) != 1 || mf.GetMetric()[0].GetGauge().GetValue() != 1 {
			t.Fatalf("%v", mf)
		}
		got := map[string]string{}
		for _, l := range mf.GetMetric()[0].GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if !maps.Equal(got, want) {
			t.Fatalf("labels %v, want %v", got, want)
		}
		return
	}
	t.Fatal("no pelguard_build_info")
}
