package reapercli

import (
	"github.com/pelguard/pelguard/internal/testkit/testenv"

	"context"
	"strings"
	"testing"
)

func call(args ...string) (int, string, string) {
	// Safe for concurrent writes: go-redis's logger is process-wide
	// (cli.RouteLibraryLogs), so a background dial of another parallel
	// test's command may write here too.
	var out, errb testenv.SyncBuffer
	code := Main(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// `reaper migrate --help` / `-h` print the migrate usage and exit 0;
// `reaper help` prints the usage (with the command list and the
// --safe-key-window default, no longer redacted) on stdout and exits 0;
// `version` and `--version` print the version.
func TestHelpAndVersion(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"migrate", "--help"}, {"migrate", "-h"}} {
		if code, _, errb := call(args...); code != 0 || !strings.Contains(errb, "pelguard-reaper migrate up|down|status") {
			t.Errorf("%v: exit %d\n%s", args, code, errb)
		}
	}
	code, out, _ := call("help")
	for _, want := range []string{"Commands:", "\n  migrate up|down|status", "--dry-run", "(default 23h0m0s)", "--wait-for-deps"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("help: exit %d, lacks %q:\n%s", code, want, out)
		}
	}
	if code, out, _ := call("help", "migrate"); code != 0 || !strings.Contains(out, "--yes") {
		t.Errorf("help migrate: exit %d\n%s", code, out)
	}
	for _, arg := range []string{"version", "--version"} {
		if code, out, _ := call(arg); code != 0 || !strings.HasPrefix(out, "pelguard-reaper ") {
			t.Errorf("%s: exit %d %q", arg, code, out)
		}
	}
}
