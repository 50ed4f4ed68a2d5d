package validate

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// `make release` on a tag (v0.0.0-validate) builds, for each platform, the
// static binaries stamped with the version (its leading v dropped, as the
// manifests' image tag is), a tarball of them, and SHA256SUMS that
// sha256sum -c accepts; an untagged, dirty tree is refused. SKIP_IMAGE=1:
// the image is TestMakeInstall/image-local's.
func TestMakeRelease(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: builds four binaries")
	}
	if out, err := exec.Command("make", "-C", repoRoot, "release", "VERSION=0123abc-dirty", "RELEASE_DIR="+t.TempDir()).CombinedOutput(); err == nil {
		t.Errorf("make release of a dirty tree exited 0:\n%s", out)
	}
	dir := t.TempDir()
	platform := "linux/" + runtime.GOARCH
	staticBuilds.Lock()
	out, err := exec.Command("make", "-C", repoRoot, "release", "VERSION=v0.0.0-validate", "RELEASE_DIR="+dir,
		"RELEASE_PLATFORMS="+platform, "SKIP_IMAGE=1").CombinedOutput()
	staticBuilds.Unlock()
	if err != nil {
		t.Fatalf("make release: %v\n%s", err, out)
	}
	name := "pelguard-0.0.0-validate-linux-" + runtime.GOARCH
	entries, _ := os.ReadDir(filepath.Join(dir, name))
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, imageBinaries) {
		t.Fatalf("release %s has %v, want %v", name, names, imageBinaries)
	}
	for _, n := range names {
		p := filepath.Join(dir, name, n)
		checkStatic(t, p)
		if b, err := exec.Command(p, "--version").CombinedOutput(); err != nil || !strings.Contains(string(b), "0.0.0-validate") || strings.Contains(string(b), "v0.0.0") {
			t.Errorf("%s --version: %v %s, want 0.0.0-validate", n, err, b)
		}
	}
	sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{name + ".tar.gz", name + "/pelguard-consumer"} {
		if !strings.Contains(string(sums), "  "+want+"\n") {
			t.Errorf("SHA256SUMS lacks %s:\n%s", want, sums)
		}
	}
	check := exec.Command("sha256sum", "-c", "SHA256SUMS")
	check.Dir = dir
	if b, err := check.CombinedOutput(); err != nil {
		t.Errorf("sha256sum -c SHA256SUMS: %v\n%s", err, b)
	}
}
