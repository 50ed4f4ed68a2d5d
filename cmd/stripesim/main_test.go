package main

import (
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
