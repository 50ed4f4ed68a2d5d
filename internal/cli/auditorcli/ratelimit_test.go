package auditorcli

import (
	"github.com/pelguard/pelguard/internal/testkit/testenv"

	"context"
	"strings"
	"testing"
)

// The auditor's Redis is optional, its rate flags are checked like the
// others': a bad one exits 2 naming the fix.
func TestAuditorBadStripeRateFlagsExit2(t *testing.T) {
	t.Parallel()
	var out, errb testenv.SyncBuffer
	code := Main(context.Background(), []string{"run", "--stripe-key", "sk_test_x", "--stripe-rate", "100",
		"--stripe-redrive-floor", "0.6", "--stripe-audit-floor", "0.6"}, &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), "--stripe-audit-floor") {
		t.Errorf("exit %d: %s; want 2 and a message naming the floors", code, errb.String())
	}
}
