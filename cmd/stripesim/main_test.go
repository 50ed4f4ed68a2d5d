package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// stripesim --help says what it is and how to point pelguard at it (the
// variable internal/cli reads for the Stripe API base), in words for
// someone trying pelguard: no Go type names.
func TestHelpSpeaksPlainly(t *testing.T) {
	if os.Getenv("STRIPESIM_TEST_MAIN") == "1" {
		os.Args = []string{"stripesim", "--help"}
		main()
		return
	}
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelpSpeaksPlainly$")
	cmd.Env = append(os.Environ(), "STRIPESIM_TEST_MAIN=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("stripesim --help: %v\n%s", err, out)
	}
	help := string(out)
	for _, want := range []string{"Stripe emulator", "pelguard", "http://127.0.0.1:12111", "STRIPE_API_BASE", "--stripe-api-base", "sk_test_", "-addr"} {
		if !strings.Contains(help, want) {
			t.Errorf("--help lacks %q:\n%s", want, help)
		}
	}
	for _, goSpeak := range []string{"stripe.BackendConfig", "stripe.String", "%!"} {
		if strings.Contains(help, goSpeak) {
			t.Errorf("--help says %q:\n%s", goSpeak, help)
		}
	}
}

// TestFlagErrorsNameTheFlag: a bad flag value stops stripesim with exit 2
// and a message naming the flag as typed and what to give, never the flag
// package's "parse error" nor the Go field behind it (ErrorRate,
// MeterEventLatency).
func TestFlagErrorsNameTheFlag(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--latency", "5"}, `--latency "5": want a duration with its unit`},
		{[]string{"--seed", "x"}, `--seed "x": want a whole number`},
		{[]string{"--error-rate", "2"}, "--error-rate 2: want a fraction from 0 to 1"},
		{[]string{"--error-rate", "-0.5"}, "--error-rate -0.5: want a fraction from 0 to 1"},
		{[]string{"--rate-limit", "-1"}, "--rate-limit -1: want 0"},
		{[]string{"--meter-event-rate-limit", "-1"}, "--meter-event-rate-limit -1: want 0"},
		{[]string{"--meter-event-latency", "-1s"}, "--meter-event-latency -1s: want 0 or more"},
		{[]string{"--latency", "-1s"}, "--latency -1s: want 0 or more"},
		{[]string{"--rk", "nokey"}, `--rk "nokey": want rk_...=perm,perm`},
		{[]string{"--addr"}, "--addr needs a value"},
	} {
		var out strings.Builder
		code := run(context.Background(), c.args, &out, &out)
		first, _, _ := strings.Cut(out.String(), "\n")
		if code != 2 || !strings.HasPrefix(first, "stripesim: "+c.want) || strings.Contains(out.String(), "parse error") {
			t.Errorf("stripesim %v: exit %d, %q: want 2 and %q", c.args, code, first, "stripesim: "+c.want)
		}
	}
}
