package validate

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
)

var (
	aptMu      sync.Mutex
	aptUpdated bool
	aptTried   = map[string]error{}
)

// tool returns the path of a command-line tool the checks need, installing
// its Debian package when it is missing and apt-get can run (as root, or
// through sudo without a password). Without it the test skips with a
// message, except under CI=true, where it fails: CI must not pass by
// skipping its checks (.ci/run installs these packages first).
func tool(t *testing.T, name, debPackage string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	err := aptInstall(debPackage)
	if p, lerr := exec.LookPath(name); lerr == nil {
		return p
	} else if err == nil {
		err = lerr
	}
	msg := fmt.Sprintf("%s is not installed and Debian's %s package could not be installed: %v\n"+
		"install it (apt-get install -y %s) to run this check", name, debPackage, err, debPackage)
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true: %s", msg)
	}
	t.Skip(msg)
	return ""
}

// aptInstall installs a Debian package once per test binary.
func aptInstall(pkg string) error {
	aptMu.Lock()
	defer aptMu.Unlock()
	if err, done := aptTried[pkg]; done {
		return err
	}
	err := func() error {
		if _, err := exec.LookPath("apt-get"); err != nil {
			return fmt.Errorf("no apt-get on this machine")
		}
		var prefix []string
		if os.Geteuid() != 0 {
			if err := exec.Command("sudo", "-n", "true").Run(); err != nil {
				return fmt.Errorf("not root, and no password-less sudo")
			}
			prefix = []string{"sudo", "-n"}
		}
		install := slices.Concat(prefix, []string{"env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-qq", "--no-install-recommends", pkg})
		if err := execQuiet(install); err == nil {
			return nil
		}
		if !aptUpdated {
			aptUpdated = true
			if err := execQuiet(slices.Concat(prefix, []string{"apt-get", "update", "-qq"})); err != nil {
				return err
			}
		}
		return execQuiet(install)
	}()
	aptTried[pkg] = err
	return err
}

func execQuiet(argv []string) error {
	cmd := exec.Command(argv[0], argv[1:]...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %v\n%s", strings.Join(argv, " "), err, out.String())
	}
	return nil
}
