// Package version says which pelguard build is running: every binary prints
// it for --version and `version`, and exports it as the
// pelguard_build_info gauge.
//
// A release sets Version at link time:
//
//	go build -ldflags "-X github.com/pelguard/pelguard/internal/version.Version=v1.4.0" ./cmd/...
//
// Without it the module's own build info stands in: the module version `go
// install …@v1.4.0` records (or the pseudo-version Go derives from the
// checkout), and the VCS revision `go build` stamps from a git checkout.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Version is the release version, set with -ldflags -X (see the package
// doc). Empty: fall back to the module's build info.
var Version string

// Unknown stands for a field the build did not record.
const Unknown = "unknown"

// Info describes the running build.
type Info struct {
	// Version is Version when set, else the main module's version from the
	// build info ("v1.4.0", a pseudo-version, or "(devel)"), else Unknown.
	Version string
	// Revision is the VCS commit the binary was built from (vcs.revision),
	// with "-dirty" when the work tree had changes; Unknown when not stamped
	// (go install …@version, -buildvcs=false).
	Revision string
	// GoVersion is the toolchain that built the binary.
	GoVersion string
}

// Get returns the running build's Info.
func Get() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return fromBuildInfo(Version, bi)
}

// fromBuildInfo is Get without the process: the ldflags version and the
// build info (nil when the binary has none).
func fromBuildInfo(ldflags string, bi *debug.BuildInfo) Info {
	info := Info{Version: strings.TrimSpace(ldflags), Revision: Unknown, GoVersion: runtime.Version()}
	if bi == nil {
		if info.Version == "" {
			info.Version = Unknown
		}
		return info
	}
	if bi.GoVersion != "" {
		info.GoVersion = bi.GoVersion
	}
	if info.Version == "" {
		info.Version = bi.Main.Version
	}
	if info.Version == "" {
		info.Version = Unknown
	}
	var rev string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev != "" {
		info.Revision = rev
		if dirty {
			info.Revision += "-dirty"
		}
	}
	return info
}

// String is the one line --version prints after the program name:
// "v1.4.0 (revision 913d496…, go1.26.0)".
func (i Info) String() string {
	return fmt.Sprintf("%s (revision %s, %s)", i.Version, i.Revision, i.GoVersion)
}
