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

func TestServeRefusesWhatCannotBeSafe(t *testing.T) {
	t.Parallel()
	users := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(users, []byte("alice:$2a$04$abcdefghijklmnopqrstuu0123456789012345678901234567890\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no identity"},
		{[]string{"--proxy-user-header", "X-Forwarded-User"}, "needs --trusted-proxy"},
		{[]string{"--users-file", users, "--proxy-user-header", "X-User", "--trusted-proxy", "10.0.0.1"}, "not both"},
		{[]string{"--users-file", users, "--listen", "0.0.0.0:9470"}, "needs --tls-cert"},
		{[]string{"--proxy-user-header", "X-User", "--trusted-proxy", "not-an-address"}, "want an address or a CIDR"},
		{[]string{"--users-file", users, "--tls-cert", "c.pem"}, "go together"},
	} {
		var stdout, stderr bytes.Buffer
		code := Main(context.Background(), append([]string{"serve"}, tc.args...), &stdout, &stderr)
		if code != cli.ExitError || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if code := Main(context.Background(), []string{"help"}, &stdout, &stderr); code != cli.ExitOK ||
		!strings.Contains(stdout.String(), "--allow-actions") || !strings.Contains(stdout.String(), "hash-password") {
		t.Fatalf("exit %d: %s %s", code, stdout.String(), stderr.String())
	}
}
