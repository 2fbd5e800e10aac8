package share

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
	mountutils "k8s.io/mount-utils"
)

// DeviceCheck fails when dev is no longer a block device, when mountPath
// is no longer a mount of it, or when that mount turned read-only (ext4
// does so on I/O errors). mountInfo is where the mount table is read
// ("/proc/self/mountinfo").
func DeviceCheck(dev, mountPath, mountInfo string) Check {
	return func(context.Context) error {
		var st unix.Stat_t
		if err := unix.Stat(dev, &st); err != nil {
			return fmt.Errorf("device %s: %w", dev, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFBLK {
			return fmt.Errorf("device %s is not a block device", dev)
		}
		mis, err := mountutils.ParseMountInfo(mountInfo)
		if err != nil {
			return err
		}
		want := filepath.Clean(mountPath)
		var found *mountutils.MountInfo
		for i := range mis {
			if mis[i].MountPoint == want {
				found = &mis[i] // the last one is the one on top
			}
		}
		if found == nil {
			return fmt.Errorf("%s is not mounted", mountPath)
		}
		if uint32(found.Major) != unix.Major(uint64(st.Rdev)) || uint32(found.Minor) != unix.Minor(uint64(st.Rdev)) {
			return fmt.Errorf("%s holds device %d:%d, not %s", mountPath, found.Major, found.Minor, dev)
		}
		if slices.Contains(found.MountOptions, "ro") {
			return fmt.Errorf("%s turned read-only (an I/O error on %s?)", mountPath, dev)
		}
		var sfs unix.Statfs_t
		if err := unix.Statfs(mountPath, &sfs); err != nil {
			return fmt.Errorf("statfs %s: %w", mountPath, err)
		}
		return nil
	}
}
