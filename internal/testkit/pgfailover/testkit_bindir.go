package pgfailover

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// InstallHint is how to get the server binaries on Debian.
const InstallHint = "apt-get install -y postgresql (or set PG_BINDIR to a directory holding initdb, postgres and pg_basebackup)"

// neededBinaries are the programs the kit runs.
var neededBinaries = []string{"initdb", "postgres", "pg_basebackup"}

// lookup is where findBinDir looks, injectable so the decision is tested
// without touching the machine.
type lookup struct {
	env      func(string) string
	glob     func(string) ([]string, error)
	pgConfig func() (string, error) // `pg_config --bindir`
	usable   func(dir string) error // nil when dir holds neededBinaries
}

func systemLookup() lookup {
	return lookup{
		env:  os.Getenv,
		glob: filepath.Glob,
		pgConfig: func() (string, error) {
			out, err := exec.Command("pg_config", "--bindir").Output()
			return strings.TrimSpace(string(out)), err
		},
		usable: usableBinDir,
	}
}

// findBinDir picks the PostgreSQL bin dir: PG_BINDIR when set (and only it:
// a wrong explicit setting is reported, not papered over), else the newest
// /usr/lib/postgresql/*/bin (Debian's layout), else `pg_config --bindir`.
func findBinDir(l lookup) (string, error) {
	if d := l.env("PG_BINDIR"); d != "" {
		if err := l.usable(d); err != nil {
			return "", fmt.Errorf("PG_BINDIR=%s: %w", d, err)
		}
		return d, nil
	}
	dirs, _ := l.glob("/usr/lib/postgresql/*/bin")
	sortByVersionDesc(dirs)
	for _, d := range dirs {
		if l.usable(d) == nil {
			return d, nil
		}
	}
	if d, err := l.pgConfig(); err == nil && d != "" {
		if err := l.usable(d); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no PostgreSQL server binaries: PG_BINDIR is unset, /usr/lib/postgresql/*/bin has none and pg_config does not name a dir with initdb, postgres and pg_basebackup")
}

func usableBinDir(dir string) error {
	for _, b := range neededBinaries {
		fi, err := os.Stat(filepath.Join(dir, b))
		if err != nil {
			return fmt.Errorf("no %s: %w", b, err)
		}
		if fi.IsDir() || fi.Mode()&0o111 == 0 {
			return fmt.Errorf("%s is not executable", filepath.Join(dir, b))
		}
	}
	return nil
}

// sortByVersionDesc orders /usr/lib/postgresql/<version>/bin paths newest
// first, comparing versions numerically (16 after 9.6).
func sortByVersionDesc(dirs []string) {
	version := func(d string) []int {
		var v []int
		for _, part := range strings.Split(filepath.Base(filepath.Dir(d)), ".") {
			n, err := strconv.Atoi(part)
			if err != nil {
				n = -1
			}
			v = append(v, n)
		}
		return v
	}
	slices.SortStableFunc(dirs, func(a, b string) int { return slices.Compare(version(b), version(a)) })
}

// unavailable is Start's verdict when it cannot run servers: skip with the
// install hint, except under CI=true, where it fails: CI must never pass by
// skipping the failover tests.
func unavailable(problem error, ci bool) (fatal bool, msg string) {
	msg = "pgfailover: cannot run a PostgreSQL primary and replica: " + problem.Error() + "; install them with: " + InstallHint
	if ci {
		return true, "CI=true, so not skipping: " + msg
	}
	return false, msg
}

func skipOrFail(t testing.TB, problem error) {
	t.Helper()
	fatal, msg := unavailable(problem, os.Getenv("CI") == "true")
	if fatal {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// runAs is the OS user the servers run as. postgres refuses to run as root,
// so as root the kit runs them as the `postgres` user Debian's package
// creates; otherwise as the current user.
type runAs struct {
	uid, gid uint32
	name     string
	asRoot   bool // the test runs as root and drops to uid/gid for the servers
}

// userLookup is os/user.Lookup.
var userLookup = user.Lookup

func serverUser(euid int, lookupUser func(string) (*user.User, error)) (runAs, error) {
	if euid != 0 {
		return runAs{uid: uint32(euid), gid: uint32(os.Getegid()), name: "current user"}, nil
	}
	u, err := lookupUser("postgres")
	if err != nil {
		return runAs{}, fmt.Errorf("running as root, and postgres refuses to run as root, but there is no `postgres` OS user to run it as (the postgresql package creates one, or: useradd --system postgres): %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return runAs{}, fmt.Errorf("user postgres: %w", err)
	}
	return runAs{uid: uint32(uid), gid: uint32(gid), name: "postgres", asRoot: true}, nil
}
