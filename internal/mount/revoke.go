package mount

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// RevokePublish takes a pod's volume away while the pod may still run (a
// deleted cluster's Detach, a stale publish entry): ForceUnpublish, then a
// tombstone where the target was. Without it a container that restarts
// would write to the node's disk: kubelet hands the runtime the target
// path again, and a runtime creates a missing host path as a folder
// (containerd's CRI does). With the tombstone, an empty file of mode 0,
// there the runtime binds that file: the container finds no folder at its
// volume's path, and every file it makes below it fails with "not a
// directory", so the loss shows. Unpublish removes it at the pod's deletion, and a
// Publish to the same target replaces it. No tombstone is left where the
// target's folder is gone: kubelet has torn the volume down already.
func (m *Manager) RevokePublish(ctx context.Context, target string) error {
	if err := m.ForceUnpublish(ctx, target); err != nil {
		return err
	}
	t := canonical(target)
	fd, err := unix.Open(t, unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_WRONLY|unix.O_CLOEXEC, 0)
	switch {
	case err == nil:
		_ = unix.Close(fd)
		m.log.Info("revoked publish: left a tombstone so that a restarted container cannot write to the node's disk", "target", t)
		return nil
	case errors.Is(err, unix.ENOENT):
		return nil // the pod's volume folder is gone
	case errors.Is(err, unix.EEXIST):
		// Something made the path again between the removal and now. The
		// volume is off this node all the same: retrying would not help.
		m.log.Error(err, "revoked publish, but the target came back before its tombstone: a restarted container may write there to the node's disk", "target", t)
		return nil
	default:
		return fmt.Errorf("tombstone at %s: %w", t, err)
	}
}

// isTombstone tells whether path is what RevokePublish leaves: an empty
// regular file of mode 0, not a symlink.
func isTombstone(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm() == 0 && fi.Size() == 0
}

// clearTombstone removes a tombstone at target so that the volume can be
// published there again; anything else there is left alone.
func (m *Manager) clearTombstone(target string) error {
	if !isTombstone(target) {
		return nil
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove tombstone %s: %w", target, err)
	}
	m.log.Info("publishing again where a publish was revoked", "target", target, "folder", filepath.Dir(target))
	return nil
}
