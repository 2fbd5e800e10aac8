package v1alpha1

import (
	"errors"
	"fmt"
	"path"
	"strings"
)

// ErrBadDataDir is returned for a data dir berth refuses.
var ErrBadDataDir = errors.New("invalid data dir")

// The folders a data dir may not be (systemDirsExact) or lie under
// (systemDirsTree): the agent and keeper mount the data dir from the host
// read-write and create, mount over and remove files in it. The CRD's CEL
// rules on spec.dataDir hold the same lists (kept equal by a test).
var (
	systemDirsTree = []string{
		"/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot",
		"/dev", "/proc", "/sys", "/run", "/var/run", "/root", "/var/lib/kubelet",
		"/var/lib/containerd", "/var/lib/docker", "/var/log",
	}
	systemDirsExact = []string{"/", "/var", "/var/lib", "/home", "/tmp", "/opt", "/srv", "/mnt", "/media"}
)

// ValidateDataDir checks a StorageCluster's spec.dataDir as the CRD does, for
// the operator and the agent (an object written before the CRD rule, or a
// --data-dir flag set by hand).
func ValidateDataDir(dir string) error {
	if !path.IsAbs(dir) || path.Clean(dir) != dir {
		return fmt.Errorf("%w: %q is not a clean absolute path", ErrBadDataDir, dir)
	}
	for _, p := range systemDirsExact {
		if dir == p {
			return fmt.Errorf("%w: %q is a system folder", ErrBadDataDir, dir)
		}
	}
	for _, p := range systemDirsTree {
		if dir == p || strings.HasPrefix(dir, p+"/") {
			return fmt.Errorf("%w: %q is or lies under the system folder %s", ErrBadDataDir, dir, p)
		}
	}
	return nil
}
