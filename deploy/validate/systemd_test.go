package validate

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const (
	systemdDir = "../systemd"
	// maxExposure is the highest `systemd-analyze security` rating a unit
	// may have (0 safest, 10 "UNSAFE"; 8.5 was where the units started).
	maxExposure = 3.0
)

// unit is a parsed unit file: section -> key -> values, in order.
type unit map[string]map[string][]string

func (u unit) get(section, key string) []string { return u[section][key] }

func (u unit) last(section, key string) string {
	v := u.get(section, key)
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

func parseUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unit{}
	section := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]")
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not key=value in a section: %q", path, n, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return u
}

func serviceFiles(t *testing.T) []string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(systemdDir, "*.service"))
	if len(files) < 5 {
		t.Fatalf("units: %v", files)
	}
	return files
}

// The sandbox directives, the same in every unit: a unit that drifts from
// the others has lost a protection (or gained one the others should have).
var sandboxKeys = regexp.MustCompile(`^(User|Group|UMask|NoNewPrivileges|CapabilityBoundingSet|AmbientCapabilities|Protect.*|Private.*|DevicePolicy|RemoveIPC|ProcSubset|Restrict.*|LockPersonality|MemoryDenyWriteExecute|SystemCall.*|IPAddress.*)$`)

func sandbox(u unit) map[string][]string {
	out := map[string][]string{}
	for k, v := range u["Service"] {
		if sandboxKeys.MatchString(k) {
			out[k] = v
		}
	}
	return out
}

// Start order that survives a Postgres that comes up late: nothing
// Requires= the migrate one-shot (a failed start would keep its dependents
// down for good); the long-running units Want= it, order After= it and
// restart on failure (they refuse a schema with pending migrations and exit
// while Postgres is unreachable); the migrate unit retries itself. Every
// unit has the same sandbox and runs a shipped binary as User=pelguard.
func TestSystemdStartOrderAndSandbox(t *testing.T) {
	t.Parallel()
	var first map[string][]string
	for _, f := range serviceFiles(t) {
		u := parseUnit(t, f)
		name := filepath.Base(f)
		for _, k := range []string{"Requires", "Requisite", "BindsTo", "PartOf"} {
			for _, v := range u.get("Unit", k) {
				if strings.Contains(v, "pelguard-migrate") {
					t.Errorf("%s: %s=%s: a migrate that failed while Postgres was down would keep it from ever starting", name, k, v)
				}
			}
		}
		exec := strings.Fields(u.last("Service", "ExecStart"))
		if len(exec) == 0 || !slices.Contains(shipped, exec[0]) {
			t.Errorf("%s: ExecStart %v, want one of %v", name, exec, shipped)
		}
		if u.last("Service", "User") != "pelguard" {
			t.Errorf("%s: User=%s, want pelguard (deploy/systemd/sysusers.d/pelguard.conf)", name, u.last("Service", "User"))
		}
		typ := u.last("Service", "Type")
		restart, restartSec := u.last("Service", "Restart"), u.last("Service", "RestartSec")
		switch {
		case name == "pelguard-migrate.service":
			if typ != "oneshot" || restart != "on-failure" || restartSec == "" {
				t.Errorf("%s: Type=%s Restart=%s RestartSec=%s, want a one-shot that retries (on-failure, with RestartSec)", name, typ, restart, restartSec)
			}
		case typ == "simple":
			if restart != "on-failure" && restart != "always" || restartSec == "" {
				t.Errorf("%s: Restart=%s RestartSec=%s, want on-failure with a RestartSec", name, restart, restartSec)
			}
			wants := strings.Join(u.get("Unit", "Wants"), " ")
			after := strings.Join(u.get("Unit", "After"), " ")
			if !strings.Contains(wants, "pelguard-migrate.service") || !strings.Contains(after, "pelguard-migrate.service") {
				t.Errorf("%s: want Wants= and After= pelguard-migrate.service, have Wants=%q After=%q", name, wants, after)
			}
		}
		sb := sandbox(u)
		if first == nil {
			first = sb
			continue
		}
		for k := range mergeKeys(first, sb) {
			if !slices.Equal(first[k], sb[k]) {
				t.Errorf("%s: %s=%q, the other units have %q", name, k, sb[k], first[k])
			}
		}
	}
}

func mergeKeys(a, b map[string][]string) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

var exposure = regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+)`)

// `systemd-analyze security` rates each unit at most 3.0 ("OK"), read from
// the unit file alone (--offline: no running systemd needed).
func TestSystemdSecurityScore(t *testing.T) {
	t.Parallel()
	bin := tool(t, "systemd-analyze", "systemd")
	for _, f := range serviceFiles(t) {
		abs, _ := filepath.Abs(f)
		out, err := exec.Command(bin, "security", "--offline=true", "--no-pager", abs).CombinedOutput()
		m := exposure.FindSubmatch(out)
		if m == nil {
			if strings.Contains(string(out), "--offline") {
				skipOrFail(t, "this systemd-analyze has no --offline (systemd >= 250 does): "+string(out))
			}
			t.Fatalf("systemd-analyze security %s: %v\n%s", f, err, out)
		}
		score, _ := strconv.ParseFloat(string(m[1]), 64)
		t.Logf("%s: exposure %.1f", filepath.Base(f), score)
		if score > maxExposure {
			t.Errorf("%s: systemd-analyze security rates it %.1f, want <= %.1f:\n%s", f, score, maxExposure, out)
		}
	}
}

// skipOrFail skips where a tool is too old, except under CI=true.
func skipOrFail(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true: %s", msg)
	}
	t.Skip(msg)
}

// `systemd-analyze verify` finds nothing wrong (unknown directives, bad
// values, missing units) in a root that has the host's system units and the
// binaries where `make install` puts them.
func TestSystemdVerify(t *testing.T) {
	t.Parallel()
	bin := tool(t, "systemd-analyze", "systemd")
	root := t.TempDir()
	unitDir := filepath.Join(root, "etc", "systemd", "system")
	for _, d := range []string{unitDir, filepath.Join(root, "usr", "local", "bin"), filepath.Join(root, "usr", "lib", "systemd")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	hostUnits := "/usr/lib/systemd/system"
	if _, err := os.Stat(hostUnits); err != nil {
		hostUnits = "/lib/systemd/system"
	}
	if out, err := exec.Command("cp", "-a", hostUnits, filepath.Join(root, "usr", "lib", "systemd")).CombinedOutput(); err != nil {
		t.Fatalf("copying the host's units: %v\n%s", err, out)
	}
	for _, b := range shipped {
		if err := os.WriteFile(filepath.Join(root, b), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var names []string
	timers, _ := filepath.Glob(filepath.Join(systemdDir, "*.timer"))
	for _, f := range append(serviceFiles(t), timers...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, filepath.Base(f))
		if err := os.WriteFile(filepath.Join(unitDir, filepath.Base(f)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, append([]string{"verify", "--root=" + root, "--man=no"}, names...)...)
	cmd.Dir = unitDir
	out, err := cmd.CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify %v: %v\n%s", names, err, out)
	}
}

// The sysusers.d file creates the pelguard user the units run as: a system
// user without a login shell.
func TestSysusers(t *testing.T) {
	t.Parallel()
	bin := tool(t, "systemd-sysusers", "systemd")
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	conf, _ := filepath.Abs(filepath.Join(systemdDir, "sysusers.d", "pelguard.conf"))
	if out, err := exec.Command(bin, "--root="+root, conf).CombinedOutput(); err != nil {
		t.Fatalf("systemd-sysusers %s: %v\n%s", conf, err, out)
	}
	passwd, err := os.ReadFile(filepath.Join(root, "etc", "passwd"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(passwd), "\n") {
		f := strings.Split(line, ":")
		if len(f) == 7 && f[0] == "pelguard" {
			uid, _ := strconv.Atoi(f[2])
			if uid == 0 || uid >= 1000 || !strings.HasSuffix(f[6], "nologin") {
				t.Errorf("pelguard user %q: want a system uid (1-999) and a nologin shell", line)
			}
			return
		}
	}
	t.Errorf("sysusers did not create pelguard:\n%s", passwd)
}
