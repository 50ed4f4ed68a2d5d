package consumercli

import (
	"context"
	"strings"
	"testing"
)

// A bad shared-rate flag exits 2 before anything connects, naming the fix.
func TestBadStripeRateFlagsExit2(t *testing.T) {
	t.Parallel()
	code, _, stderr := call(context.Background(), "--stripe-key", "sk_test_x", "--stripe-rate", "100", "--stripe-fallback-rate", "500")
	if code != 2 || !strings.Contains(stderr, "--stripe-fallback-rate") || !strings.Contains(stderr, "processes") {
		t.Errorf("exit %d: %s; want 2 and a message naming --stripe-fallback-rate and its fix", code, stderr)
	}
}
