package e2e

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The CLI's rough edges, on the real binaries: `migrate --help` and `-h`
// print the migrate usage and exit 0 in all three; so do `consumer cap
// --help`, `consumer help` and `help COMMAND`; `auditor --help` lists its
// commands.
func TestCLIHelp(t *testing.T) {
	t.Parallel()
	for _, bin := range []string{"consumer", "reaper", "auditor"} {
		for _, h := range []string{"--help", "-h"} {
			res := runBin(t, bin, baseEnv(), 30*time.Second, "migrate", h)
			if res.code != 0 || !strings.Contains(res.out, "Usage: pelguard-"+bin+" migrate up|down|status") || strings.Contains(res.out, "unknown") {
				t.Errorf("%s migrate %s: exit %d\n%s", bin, h, res.code, res.out)
			}
		}
		for _, args := range [][]string{{"help"}, {"help", "migrate"}} {
			if res := runBin(t, bin, baseEnv(), 30*time.Second, args...); res.code != 0 || !strings.Contains(res.out, "Usage: pelguard-"+bin) {
				t.Errorf("%s %v: exit %d\n%s", bin, args, res.code, res.out)
			}
		}
	}
	if res := runBin(t, "consumer", baseEnv(), 30*time.Second, "cap", "--help"); res.code != 0 || !strings.Contains(res.out, "--cents") {
		t.Errorf("consumer cap --help: exit %d\n%s", res.code, res.out)
	}
	res := runBin(t, "auditor", baseEnv(), 30*time.Second, "--help")
	for _, cmd := range []string{"refund", "findings", "resolve", "dismiss", "migrate"} {
		if res.code != 0 || !regexp.MustCompile(`(?m)^  `+cmd+`\b`).MatchString(res.out) {
			t.Errorf("auditor --help does not list %s (exit %d):\n%s", cmd, res.code, res.out)
		}
	}
}

// Every binary answers `version` and --version with the version set by
// -ldflags -X …/internal/version.Version, and without it with the module's
// build info; stripesim does not start a server for it.
func TestVersion(t *testing.T) {
	t.Parallel()
	const v = "v9.9.9-e2e"
	dir := t.TempDir()
	for _, b := range []string{"consumer", "reaper", "auditor", "stripesim"} {
		out := filepath.Join(dir, b)
		cmd := exec.Command("go", "build", "-ldflags", "-X github.com/pelguard/pelguard/internal/version.Version="+v,
			"-o", out, "github.com/pelguard/pelguard/cmd/"+b)
		if msg, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", b, err, msg)
		}
		for _, arg := range []string{"version", "--version"} {
			got := runVersion(t, out, arg)
			name := b
			if b != "stripesim" {
				name = "pelguard-" + b // the installed name
			}
			if !strings.HasPrefix(got, name+" "+v+" (revision ") || !strings.Contains(got, "go1.") || strings.Contains(got, "http://") {
				t.Errorf("%s %s: %q", b, arg, got)
			}
		}
	}
	// Built without -ldflags (TestMain's binaries): the module's version.
	line := regexp.MustCompile(`^pelguard-(consumer|reaper|auditor) \S+ \(revision \S+, go1\.[^)]+\)\n$`)
	for _, b := range []string{"consumer", "reaper", "auditor"} {
		if got := runVersion(t, bins[b], "--version"); !line.MatchString(got) {
			t.Errorf("%s --version without -ldflags: %q", b, got)
		}
	}
}

// runVersion runs bin arg, which must exit 0 within 10s.
func runVersion(t *testing.T, bin, arg string) string {
	t.Helper()
	cmd := exec.Command(bin, arg)
	cmd.Env = baseEnv()
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.Output(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%s %s did not exit (started a server?): %s", filepath.Base(bin), arg, out)
	}
	if err != nil {
		t.Fatalf("%s %s: %v %s", filepath.Base(bin), arg, err, out)
	}
	return string(out)
}
