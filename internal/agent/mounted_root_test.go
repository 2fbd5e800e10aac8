package agent

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRootMountedAtThroughSymlink: the keeper check finds a real mount
// when the run dir is named through a symlink (/var/run/berth for
// /run/berth), and finds none where nothing is mounted.
func TestRootMountedAtThroughSymlink(t *testing.T) {
	dir := t.TempDir()
	target, link := filepath.Join(dir, "real"), filepath.Join(dir, "link")
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts a tmpfs")
	}
	mp := filepath.Join(target, "vol-1")
	if err := os.MkdirAll(mp, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	tmpfs := func(fsType string) bool { return fsType == "tmpfs" }
	if ok, err := mountedAt(filepath.Join(link, "vol-1"), tmpfs); err != nil || ok {
		t.Fatalf("before the mount: %t, %v; want not mounted", ok, err)
	}
	if err := unix.Mount("berth-test", mp, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mp, unix.MNT_DETACH) })
	if ok, err := mountedAt(filepath.Join(link, "vol-1"), tmpfs); err != nil || !ok {
		t.Errorf("through the symlink: %t, %v; want mounted", ok, err)
	}
	if ok, err := mountedAt(mp, func(fsType string) bool { return fsType == "fuse.berth" }); err != nil || ok {
		t.Errorf("a tmpfs taken for a FUSE mount: %t, %v", ok, err)
	}
}
