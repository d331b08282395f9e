// Package version says which sluice this is: its release version and
// the commit it was built from. The build stamps both in (make build,
// make dist and the packages, from scripts/version.sh); a plain `go
// build` falls back on what Go stamps itself.
//
// `sluice version`, the agent's sluice_build_info metric and every
// package built from one tree say the same.
package version

import "runtime/debug"

// Set by the build:
//
//	-ldflags "-X sluice/version.stamped=v0.1.0 -X sluice/version.commit=83b5683d61b3"
var stamped, commit string

// String is the version: v0.1.0 on a release, v0.1.1-dev.3+g83b5683d61b3
// three commits after it (scripts/version.sh says the forms), Go's own
// module version for a build that was not stamped, or v0.0.0-dev.
func String() string {
	if stamped != "" {
		return stamped
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "v0.0.0-dev"
}

// Commit is the commit the build came from (12 hex digits, "-dirty"
// with uncommitted changes), or "unknown".
func Commit() string {
	if commit != "" {
		return commit
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	switch {
	case rev == "":
		return "unknown"
	case len(rev) > 12:
		rev = rev[:12]
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}
