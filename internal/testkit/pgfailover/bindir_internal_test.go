package pgfailover

import (
	"errors"
	"os/user"
	"strings"
	"testing"
)

// CI must never pass by skipping the failover tests: without the server
// binaries it fails; elsewhere it skips, saying how to install them.
func TestUnavailableFailsUnderCIAndSaysHowToInstall(t *testing.T) {
	t.Parallel()
	for _, ci := range []bool{false, true} {
		fatal, msg := unavailable(errors.New("PG_BINDIR=/nowhere: no initdb"), ci)
		if fatal != ci {
			t.Errorf("CI=%v: fatal %v, want %v", ci, fatal, ci)
		}
		if !strings.Contains(msg, "apt-get install -y postgresql") || !strings.Contains(msg, "PG_BINDIR=/nowhere") {
			t.Errorf("CI=%v: message %q should name the problem and the install command", ci, msg)
		}
	}
}

func TestFindBinDirOrder(t *testing.T) {
	t.Parallel()
	has := map[string]bool{"/usr/lib/postgresql/9.6/bin": true, "/usr/lib/postgresql/16/bin": true, "/opt/pg/bin": true}
	l := func(env string, globbed []string, pgConfig string) lookup {
		return lookup{
			env:      func(k string) string { return map[string]string{"PG_BINDIR": env}[k] },
			glob:     func(string) ([]string, error) { return globbed, nil },
			pgConfig: func() (string, error) { return pgConfig, nil },
			usable: func(d string) error {
				if has[d] {
					return nil
				}
				return errors.New("no initdb")
			},
		}
	}
	debian := []string{"/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/9.6/bin", "/usr/lib/postgresql/17/bin"} // 17: client only
	for _, tc := range []struct {
		name, env   string
		globbed     []string
		pgConfig    string
		want, wantE string
	}{
		{name: "PG_BINDIR wins", env: "/opt/pg/bin", globbed: debian, want: "/opt/pg/bin"},
		{name: "PG_BINDIR pointing nowhere is reported, not replaced", env: "/nowhere", globbed: debian, wantE: "PG_BINDIR=/nowhere"},
		{name: "newest usable Debian version, numerically", globbed: debian, want: "/usr/lib/postgresql/16/bin"},
		{name: "pg_config when Debian's layout is absent", pgConfig: "/opt/pg/bin", want: "/opt/pg/bin"},
		{name: "nothing", pgConfig: "/usr/bin", wantE: "no PostgreSQL server binaries"},
	} {
		got, err := findBinDir(l(tc.env, append([]string(nil), tc.globbed...), tc.pgConfig))
		if got != tc.want || (tc.wantE == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantE)) {
			t.Errorf("%s: %q, %v; want %q, error containing %q", tc.name, got, err, tc.want, tc.wantE)
		}
	}
}

// postgres refuses to run as root: as root the kit runs it as the postgres
// OS user, and without one it says how to make one.
func TestServerUserAsRoot(t *testing.T) {
	t.Parallel()
	found := func(string) (*user.User, error) { return &user.User{Uid: "101", Gid: "104", Username: "postgres"}, nil }
	missing := func(name string) (*user.User, error) { return nil, user.UnknownUserError(name) }
	if u, err := serverUser(0, found); err != nil || !u.asRoot || u.uid != 101 || u.gid != 104 {
		t.Errorf("root with a postgres user: %+v, %v", u, err)
	}
	if _, err := serverUser(0, missing); err == nil || !strings.Contains(err.Error(), "useradd --system postgres") {
		t.Errorf("root without a postgres user: %v, want the fix named", err)
	}
	if u, err := serverUser(1000, missing); err != nil || u.asRoot || u.uid != 1000 {
		t.Errorf("non-root: %+v, %v; want to run as the current user", u, err)
	}
}

func TestLSNRoundTrip(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"0/0", "0/3006B90", "1A/FF000028"} {
		l, err := ParseLSN(s)
		if err != nil || l.String() != s {
			t.Errorf("ParseLSN(%q) = %v, %v", s, l, err)
		}
	}
	if a, b := LSN(0x1_00000000), LSN(0xFFFFFFFF); a <= b {
		t.Error("LSNs must compare across the high word")
	}
	if _, err := ParseLSN("garbage"); err == nil {
		t.Error("ParseLSN accepted garbage")
	}
}
