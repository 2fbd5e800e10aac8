package userspace

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/backend"
)

// TestExpandOnline grows the image of a staged and published userspace XFS
// volume, as the controller does, and expands it through the agent: the
// loop device on the FUSE file and the mounted filesystem must both grow.
func TestExpandOnline(t *testing.T) {
	f := setup(t)
	nc := f.node(t)
	m := f.userspaceVolumeFS(t, nc, "expand", "xfs", "320Mi") // mkfs.xfs wants 300 MB
	ctx := context.Background()

	dev := stagedDevice(t, m.staging)
	before := devSize(t, dev)
	images, err := backend.NewLocal(filepath.Join(f.dir, "data"), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	const want = 512 << 20
	if _, err := images.Expand(ctx, m.name, want); err != nil {
		t.Fatalf("grow image: %v", err)
	}
	expandXFS(t, nc, m, dev, before, want)
}

// expandXFS expands m (xfs on dev, before bytes), whose image grew to want
// bytes, through the agent: the loop device and the filesystem must grow.
func expandXFS(t *testing.T, nc csi.NodeClient, m mounted, dev string, before, want int64) {
	t.Helper()
	ctx := context.Background()
	if err := retryBusy(func() error {
		_, err := nc.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: m.name, VolumePath: m.target,
			StagingTargetPath: m.staging, VolumeCapability: mountCapFS("xfs"),
			CapacityRange: &csi.CapacityRange{RequiredBytes: want}})
		return err
	}); err != nil {
		t.Fatalf("NodeExpandVolume: %v", err)
	}
	if got := devSize(t, dev); got != want {
		t.Errorf("loop device %s: %d bytes after expansion (%d before), want %d", dev, got, before, want)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(m.target, &st); err != nil {
		t.Fatal(err)
	}
	// XFS keeps its log and metadata out of the data blocks: more than the
	// old device size shows the filesystem grew.
	if got := int64(st.Blocks) * st.Bsize; got <= before {
		t.Errorf("filesystem at %s: %d bytes after expansion, want more than the old device's %d", m.target, got, before)
	}
}

// stagedDevice is the device mounted at the staging path.
func stagedDevice(t *testing.T, staging string) string {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(staging))
	if err != nil || len(ms) != 1 || !strings.HasPrefix(ms[0].Source, "/dev/loop") {
		t.Fatalf("mount at %s: %+v, %v; want one loop device", staging, ms, err)
	}
	return ms[0].Source
}

// devSize is a block device's size from sysfs (512-byte sectors).
func devSize(t *testing.T, dev string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "size"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n * 512
}
