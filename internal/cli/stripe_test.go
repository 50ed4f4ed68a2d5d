package cli

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/pelguard/pelguard/stripelimit"
)

func parseStripe(t *testing.T, args ...string) *Stripe {
	t.Helper()
	var s Stripe
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	s.Register(fs)
	if err := fs.Parse(append([]string{"--stripe-key", "sk_test_x"}, args...)); err != nil {
		t.Fatal(err)
	}
	return &s
}

// Bad rate-limit flags stop at start with a usage error naming the flag
// and the fix.
func TestStripeRateFlagsNameTheFix(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--stripe-rate", "-1"}, "--stripe-rate must not be negative"},
		{[]string{"--stripe-fallback-rate", "10"}, "set --stripe-rate"},
		{[]string{"--stripe-endpoint-rate", "25"}, "set --stripe-rate"},
		{[]string{"--stripe-rate", "100", "--stripe-fallback-rate", "200"}, "--stripe-rate ÷ processes"},
		{[]string{"--stripe-rate", "100", "--stripe-redrive-floor", "0.5", "--stripe-audit-floor", "0.5"}, "together below 0.9"},
		{[]string{"--stripe-rate", "100", "--stripe-audit-floor", "-0.1"}, "--stripe-audit-floor"},
		{[]string{"--stripe-rate", "100", "--stripe-429-backoff", "2h"}, "--stripe-429-backoff"},
		{[]string{"--stripe-rate", "100", "--stripe-account", "sk_live_abc def"}, "--stripe-account"},
		{[]string{"--stripe-rate", "100", "--stripe-endpoint-rate", "-5"}, "--stripe-endpoint-rate"},
	} {
		err := parseStripe(t, tc.args...).Validate()
		var ue *UsageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v; want a usage error naming %q", tc.args, err, tc.want)
		}
	}
	if err := parseStripe(t, "--stripe-rate", "95", "--stripe-fallback-rate", "30", "--stripe-account", "acct_1Abc").Validate(); err != nil {
		t.Errorf("good flags refused: %v", err)
	}
}

// --stripe-rate builds the account's shared limiter; without it there is
// none; without Redis the limiter is this process's own share.
func TestStripeLimiterFromFlags(t *testing.T) {
	t.Parallel()
	lim, err := parseStripe(t).Limiter(Share{Role: stripelimit.RoleBilling})
	if err != nil || lim != nil {
		t.Fatalf("no --stripe-rate: %v, %v; want no limiter", lim, err)
	}
	lim, err = parseStripe(t, "--stripe-rate", "100").Limiter(Share{Role: stripelimit.RoleAudit})
	if err != nil {
		t.Fatal(err)
	}
	l := lim.(*stripelimit.Limiter)
	if l.Shared() || l.Role() != stripelimit.RoleAudit {
		t.Errorf("without Redis: shared %v role %s; want this process alone, audit", l.Shared(), l.Role())
	}
}

// Live meter events get a schedule of their own (Stripe's 1,000/s outside
// the account's rate); test keys' meter events stay on the account's.
func TestMeterLimiterOnlyForLiveKeys(t *testing.T) {
	t.Parallel()
	s := parseStripe(t, "--stripe-rate", "100")
	if l, err := s.MeterLimiter(Share{}); err != nil || l != nil {
		t.Fatalf("test key: %v, %v; want no meter schedule", l, err)
	}
	s.APIKey = "rk_live_x"
	l, err := s.MeterLimiter(Share{})
	if err != nil || l == nil {
		t.Fatalf("live key: %v, %v; want a meter schedule", l, err)
	}
	if lim := l.(*stripelimit.Limiter); lim.Role() != stripelimit.RoleBilling {
		t.Fatalf("role %s", lim.Role())
	}
	s.RateLimit = 0
	if l, err := s.MeterLimiter(Share{}); err != nil || l != nil {
		t.Fatalf("no --stripe-rate: %v, %v; want none", l, err)
	}
}
