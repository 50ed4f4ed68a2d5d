package version

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	t.Parallel()
	bi := &debug.BuildInfo{
		GoVersion: "go1.26.0",
		Main:      debug.Module{Path: "github.com/pelguard/pelguard", Version: "v0.0.0-20261201000000-913d496abcde+dirty"},
		Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "913d496abcdef0123456789"}, {Key: "vcs.modified", Value: "true"},
		},
	}
	for _, tc := range []struct {
		name    string
		ldflags string
		bi      *debug.BuildInfo
		want    Info
	}{
		{"ldflags win", "v1.4.0", bi, Info{Version: "v1.4.0", Revision: "913d496abcdef0123456789-dirty", GoVersion: "go1.26.0"}},
		{"module version", "", bi, Info{Version: bi.Main.Version, Revision: "913d496abcdef0123456789-dirty", GoVersion: "go1.26.0"}},
		{"go install @version: no vcs", "", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.4.0"}},
			Info{Version: "v1.4.0", Revision: Unknown, GoVersion: "go1.26.0"}},
		{"nothing recorded", "", &debug.BuildInfo{GoVersion: "go1.26.0"}, Info{Version: Unknown, Revision: Unknown, GoVersion: "go1.26.0"}},
	} {
		if got := fromBuildInfo(tc.ldflags, tc.bi); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
	if got := fromBuildInfo("", nil); got.Version != Unknown || got.Revision != Unknown || !strings.HasPrefix(got.GoVersion, "go") {
		t.Errorf("without build info: %+v", got)
	}
}

// A test binary has build info: Get never answers empty fields.
func TestGet(t *testing.T) {
	t.Parallel()
	i := Get()
	if i.Version == "" || i.Revision == "" || i.GoVersion == "" {
		t.Fatalf("%+v", i)
	}
	if s := i.String(); !strings.Contains(s, i.Version) || !strings.Contains(s, "revision") {
		t.Fatalf("String() = %q", s)
	}
}
