package reapercli

import (
	"github.com/pelguard/pelguard/internal/testkit/testenv"

	"context"
	"strings"
	"testing"
)

// --min-idle below 2 × --external-max-call is refused at start, before any
// connection, with a message naming both flags: the team's consumers have
// no heartbeat, so that margin is all that keeps the reaper from
// "reclaim while in flight".
func TestExternalLedgerMinIdleBelowTwiceMaxCallIsRefused(t *testing.T) {
	t.Parallel()
	base := []string{"--once", "--stream", "s", "--group", "g", "--external-ledger", "public.billing_records",
		"--stripe-mode", "charges", "--stripe-key", "sk_test_x", "--wait-for-deps", "0s"}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--min-idle", "60s", "--external-max-call", "90s"}, []string{"--min-idle 1m0s", "--external-max-call 1m30s", "3m0s"}},
		{[]string{"--min-idle", "60s"}, []string{"--external-max-call"}},
		{[]string{"--min-idle", "5m", "--external-max-call", "90s", "--stripe-mode", "payment_intents"}, []string{"--stripe-mode charges"}},
	} {
		var out, errb testenv.SyncBuffer
		args := append(append([]string{}, base...), tc.args...)
		if code := Main(context.Background(), args, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", tc.args, code, errb.String())
		}
		for _, w := range tc.want {
			if !strings.Contains(errb.String(), w) {
				t.Errorf("%v: message %q does not name %q", tc.args, errb.String(), w)
			}
		}
	}
	var out, errb testenv.SyncBuffer
	if code := Main(context.Background(), []string{"--external-max-call", "1s", "--stream", "s", "--group", "g", "--dry-run", "--once"}, &out, &errb); code != 2 ||
		!strings.Contains(errb.String(), "--external-ledger") {
		t.Errorf("--external-max-call alone: exit %d: %s", code, errb.String())
	}
}
