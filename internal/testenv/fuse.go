package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// AbortFUSE aborts the FUSE connection mounted at mountpoint through
// fusectl: every request waiting on it fails at once. Tests call it to
// end a connection whose server is gone while another process (a keeper)
// still holds /dev/fuse, so that nothing waits on it for ever. It mounts
// fusectl on a temporary folder when /sys/fs/fuse/connections has none.
func AbortFUSE(mountpoint string) error {
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(mountpoint))
	if err != nil {
		return fmt.Errorf("read mountinfo: %w", err)
	}
	if len(ms) == 0 {
		return fmt.Errorf("no mount at %s", mountpoint)
	}
	ctl := "/sys/fs/fuse/connections"
	if c, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(ctl)); err != nil || len(c) == 0 || c[0].FSType != "fusectl" {
		if ctl, err = os.MkdirTemp("", "berth-fusectl-"); err != nil {
			return fmt.Errorf("fusectl folder: %w", err)
		}
		defer func() { _ = os.Remove(ctl) }()
		if err := unix.Mount("fusectl", ctl, "fusectl", 0, ""); err != nil {
			return fmt.Errorf("mount fusectl: %w", err)
		}
		defer func() { _ = unix.Unmount(ctl, 0) }()
	}
	abort := filepath.Join(ctl, strconv.Itoa(ms[0].Minor), "abort")
	if err := os.WriteFile(abort, []byte("1"), 0); err != nil {
		return fmt.Errorf("abort the FUSE connection at %s: %w", mountpoint, err)
	}
	return nil
}
