// Package version holds the build's version, set at link time by the Makefile.
package version

import "runtime"

// Set with -ldflags "-X github.com/berth-io/berth/internal/version.Version=...".
// They are variables only because the linker can set nothing else.
var (
	Version = "dev"
	Commit  = "unknown"
)

// Info is the version of this binary.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"goVersion"`
	// Ceph tells whether the ceph backend is built in (build tag ceph).
	Ceph bool `json:"ceph"`
}

// Get returns the version of this binary.
func Get() Info {
	return Info{Version: Version, Commit: Commit, GoVersion: runtime.Version(), Ceph: ceph}
}
