package mount

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	mountutils "k8s.io/mount-utils"
)

// Condition reports whether a staged volume looks unhealthy: nothing
// mounted, a stale mount, a filesystem the kernel turned read-only after
// errors, a device gone, or a loop device whose image was deleted.
func (m *Manager) Condition(_ context.Context, stagingPath string) (abnormal bool, msg string) {
	mis, err := m.mountInfo()
	if err != nil {
		return true, err.Error()
	}
	staging := canonical(stagingPath)
	var dev string
	if mi := mountAt(mis, filepath.Join(staging, BlockStageFile)); mi != nil {
		dev = boundDevice(mis, mi)
	} else if mi := mountAt(mis, staging); mi != nil && mi.FsType == "devtmpfs" {
		dev = boundDevice(mis, mi) // a published block volume: the device node itself
	} else if mi != nil {
		if _, err := os.Stat(staging); mountutils.IsCorruptedMnt(err) {
			return true, fmt.Sprintf("stale mount at %s: %v", staging, err)
		}
		// The kernel marks the superblock read-only on errors while the mount
		// itself still says rw.
		if isReadOnly(mi.SuperOptions) && !isReadOnly(mi.MountOptions) {
			return true, fmt.Sprintf("filesystem at %s was remounted read-only", staging)
		}
		dev = fsDevice(mi)
	} else {
		return true, fmt.Sprintf("nothing mounted at %s", staging)
	}
	if _, err := os.Stat(dev); err != nil {
		return true, fmt.Sprintf("device %s: %v", dev, err)
	}
	if name := filepath.Base(dev); strings.HasPrefix(name, "loop") {
		back, err := os.ReadFile(filepath.Join("/sys/block", name, "loop", "backing_file"))
		switch {
		case err != nil:
			return true, fmt.Sprintf("loop device %s has no backing file (detached?): %v", dev, err)
		case strings.HasSuffix(strings.TrimSpace(string(back)), "(deleted)"):
			return true, fmt.Sprintf("image behind %s was deleted", dev)
		}
	}
	return false, ""
}
