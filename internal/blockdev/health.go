package blockdev

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// ErrDisconnected means the FUSE connection behind a mountpoint is gone (the
// keeper died, or the connection was aborted): the loop device above now
// fails every I/O and only unmount, detach, fsck and remount recover.
var ErrDisconnected = errors.New("fuse connection is gone (keeper died?)")

// CheckMount asks the file system for statfs, which the kernel never answers
// from a cache. While the connection lives but no server runs, the call waits
// for the next server, so call it while one runs; the keeper itself is
// checked with keeper.Client.Ping.
func CheckMount(mountpoint string) error {
	var st unix.Statfs_t
	err := unix.Statfs(mountpoint, &st)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ENOTCONN), errors.Is(err, unix.ECONNABORTED):
		return fmt.Errorf("%s: %w", mountpoint, ErrDisconnected)
	default:
		return fmt.Errorf("stat %s: %w", mountpoint, err)
	}
}
