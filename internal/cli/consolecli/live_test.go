package consolecli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pelguard/pelguard/internal/cli"
)

// The live pages' flags stop the console at start with a message naming the
// fix: a reaper policy no reaper can have, a Prometheus URL that is not one.
func TestServeRefusesBadLiveFlags(t *testing.T) {
	t.Parallel()
	users := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(users, []byte("alice:$2a$04$abcdefghijklmnopqrstuu0123456789012345678901234567890\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--reaper-min-idle", "0s"}, "give the reaper's --min-idle"},
		{[]string{"--reaper-max-deliveries", "0"}, "give the reaper's --max-deliveries"},
		{[]string{"--refresh", "-1s"}, "0 turns it off"},
		{[]string{"--prometheus-url", "prometheus:9090"}, "want Prometheus's base URL"},
		{[]string{"--meter-stream", "=meters"}, "--meter-stream"},
	} {
		var stdout, stderr bytes.Buffer
		code := Main(context.Background(), append([]string{"serve", "--users-file", users}, tc.args...), &stdout, &stderr)
		if code != cli.ExitError || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}
