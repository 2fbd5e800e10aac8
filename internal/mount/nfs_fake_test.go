package mount

import (
	"errors"
	"slices"
	"testing"
)

// MountNFS mounts the share with the failover options, a retry is success,
// another mount at the target is ErrExists; NFSCondition knows the mount,
// and Unpublish takes it away.
func TestFakeMountNFS(t *testing.T) {
	f := newFakeEnv(t)
	target := f.path("pod/mount")
	r := NFSRequest{VolumeID: "vol-a", Source: "sm.ns.svc:/vol-a", TargetPath: target, MountFlags: []string{"port=2050"}}
	for range 2 {
		if err := f.mgr.MountNFS(t.Context(), r); err != nil {
			t.Fatal(err)
		}
	}
	mps, _ := f.mounter.List()
	if len(mps) != 1 || mps[0].Type != "nfs4" || !slices.Equal(mps[0].Opts, append(nfsOptions(), "port=2050")) {
		t.Fatalf("mounts %+v", mps)
	}
	if !slices.Contains(mps[0].Opts, "nosuid") || !slices.Contains(mps[0].Opts, "nodev") {
		t.Errorf("share mounted with %v: without nosuid,nodev a writer of the share plants setuid files and devices", mps[0].Opts)
	}
	if abnormal, msg, share := f.mgr.NFSCondition(t.Context(), target); abnormal || !share {
		t.Errorf("condition of the share's mount: %t %q share %t", abnormal, msg, share)
	}
	if _, _, share := f.mgr.NFSCondition(t.Context(), f.path("elsewhere")); share {
		t.Error("an unmounted path taken for a share")
	}
	if err := f.mgr.ProbeShare(t.Context(), target); err != nil {
		t.Errorf("probe of the share's mount: %v", err)
	}
	if err := f.mgr.ProbeShare(t.Context(), f.path("elsewhere")); !errors.Is(err, ErrNotShareMount) {
		t.Errorf("probe of a path without the share: %v, want ErrNotShareMount", err)
	}
	other := r
	other.Source = "other.ns.svc:/vol-b"
	if err := f.mgr.MountNFS(t.Context(), other); !errors.Is(err, ErrExists) {
		t.Errorf("mount another share at the same target: %v, want ErrExists", err)
	}
	if err := f.mgr.Unpublish(t.Context(), target); err != nil {
		t.Fatal(err)
	}
	if f.mounts() != 0 {
		t.Errorf("unpublish left %d mounts", f.mounts())
	}
}
