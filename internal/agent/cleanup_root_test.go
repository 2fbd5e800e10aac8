package agent

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"
	"k8s.io/utils/exec"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/blockdev"
	"github.com/berth-io/berth/internal/mount"
)

// TestRootUndoFreesLoopOfUnreachableDataDir: a volume of a deleted
// StorageCluster is staged on a kernel loop device over its image, and the
// cluster's data dir is no longer mounted into the agent (as after the
// agent's pod came back without it). sysfs then names the image only from
// its data dir's root ("/volumes/<id>.img") and the agent's backend finds
// no image. Undoing the stale stage entry unmounts the staging and frees
// the loop device. Before the fix, the staging was unmounted but the loop
// device stayed bound to the image for good (CI run 12's e2e
// StorageClusterDeletionWithAgentAway).
func TestRootUndoFreesLoopOfUnreachableDataDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: real loop devices, mkfs and mounts")
	}
	ctx := t.Context()
	log := testr.NewWithInterface(t, testr.Options{})
	// The deleted cluster's data dir, as the old agent saw it: a bind mount.
	dataDir, seen := t.TempDir(), filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(seen, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dataDir, seen, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("bind mount: %v", err)
	}
	bound := true
	t.Cleanup(func() {
		if bound {
			_ = unix.Unmount(seen, unix.MNT_DETACH)
		}
	})
	old, err := backend.NewLocal(seen, log)
	if err != nil {
		t.Fatal(err)
	}
	img, err := old.Create(ctx, "vol", 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	loop := mount.NewLoop(exec.New())
	dev, err := loop.Attach(ctx, img.Path, false)
	if err != nil {
		t.Skipf("loop device: %v", err)
	}
	t.Cleanup(func() { _ = loop.Detach(context.Background(), dev) })
	mounts := mount.NewManager(mount.NewMounter(), exec.New(), log)
	staging := filepath.Join(t.TempDir(), "staging")
	if err := mounts.Stage(ctx, mount.StageRequest{VolumeID: "vol", Device: dev, StagingPath: staging}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(staging, unix.MNT_DETACH) })

	// The agent's pod came back without the deleted cluster's folder.
	if err := unix.Unmount(seen, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	bound = false
	if name, found, err := loop.BackingName(dev); err != nil || !found || name != "/"+backend.VolumeFile("vol") {
		t.Fatalf("sysfs names %s's backing file %q (found %t, %v); want the tail below the data dir", dev, name, found, err)
	}
	ownImages, err := backend.NewLocal(t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	a := newTestAgent(t, Config{Images: ownImages, Loop: loop, Mounts: mounts, Log: log, API: fakeAPI(t).Build()})

	if err := a.forceUnstage(ctx, "vol", staging, lockBroken(v1.ReasonClusterDeleted)); err != nil {
		t.Fatalf("force unstage: %v", err)
	}
	if m, _, err := mounts.StagedDevice(ctx, staging); err != nil || m != "" {
		t.Errorf("staging %s still holds %q (%v)", staging, m, err)
	}
	if name, found, err := loop.BackingName(dev); err != nil || found {
		t.Errorf("%s is still bound to %q (%v): the loop device leaked", dev, name, err)
	}
	// A second undo of the same entry finds nothing and succeeds.
	if err := a.forceUnstage(ctx, "vol", staging, false); err != nil {
		t.Errorf("second force unstage: %v", err)
	}
}

// TestRootFUSEHoldsDetachedConnection: the FUSE transport's Holds names a
// loop device on the volume's disk.img, also once the connection's mount
// is detached (sysfs then says "/disk.img"; CI found such a device left
// after a lost share manager's node came back), and never another
// volume's.
func TestRootFUSEHoldsDetachedConnection(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a tmpfs and a real loop device")
	}
	root := t.TempDir()
	mp := filepath.Join(root, "vol")
	if err := os.Mkdir(mp, 0o700); err != nil {
		t.Fatal(err)
	}
	// A tmpfs stands in for the FUSE connection: Holds reads only sysfs.
	if err := unix.Mount("berth-test", mp, "tmpfs", 0, "size=80m"); err != nil {
		t.Skipf("tmpfs: %v", err)
	}
	mounted := true
	t.Cleanup(func() {
		if mounted {
			_ = unix.Unmount(mp, unix.MNT_DETACH)
		}
	})
	file := filepath.Join(mp, blockdev.FileName)
	if err := os.WriteFile(file, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	loop := mount.NewLoop(exec.New())
	dev, err := loop.Attach(t.Context(), file, false)
	if err != nil {
		t.Skipf("loop device: %v", err)
	}
	t.Cleanup(func() { _ = loop.Detach(context.Background(), dev) })
	f := fuseDevice{userspace: userspace{cfg: &UserspaceConfig{Root: root}}, loop: loop}
	check := func(when, volume string, want bool) {
		t.Helper()
		if got, err := f.Holds(volume, dev); err != nil || got != want {
			t.Errorf("%s: Holds(%s, %s) = %t, %v; want %t", when, volume, dev, got, err, want)
		}
	}
	check("mounted", "vol", true)
	check("mounted", "other", false)
	if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	mounted = false
	if name, _, _ := loop.BackingName(dev); name != "/"+blockdev.FileName {
		t.Fatalf("sysfs names %q for a detached connection's file; this test expects %q", name, "/"+blockdev.FileName)
	}
	check("detached", "vol", true)
}
