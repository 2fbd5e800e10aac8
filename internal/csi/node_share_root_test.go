package csi

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	utilexec "k8s.io/utils/exec"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/agent"
	"github.com/berth-io/berth/internal/mount"
	"github.com/berth-io/berth/internal/volid"
)

// kubeletVolumes plays the one rule of kubelet's volume manager that issue
// #33 ran into: a node's volume state is keyed by driver^handle
// (k8s.io/kubernetes pkg/volume/csi/csi_plugin.go GetVolumeName), and a
// volume already staged under that key is not staged again for the next
// pod: MountVolume skips MountDevice and MapVolume skips SetUpDevice (so
// NodeStageVolume) when the device is DeviceGloballyMounted
// (pkg/volume/util/operationexecutor/operation_generator.go). The volume is
// unstaged, at the staging path it was staged at, once its last pod went.
type kubeletVolumes struct {
	node   *Node
	staged map[string]string // driver^handle -> the staging path of its NodeStageVolume
	pods   map[string]int    // driver^handle -> pods that use it
}

func kubeletName(handle string) string { return "kubernetes.io/csi/" + v1.DriverName + "^" + handle }

// setUp is one pod's MountVolume (MapVolume for block): NodeStageVolume
// unless the volume is staged on the node already, then NodePublishVolume.
func (k *kubeletVolumes) setUp(ctx context.Context, handle, staging, target string, c *csi.VolumeCapability, podUID string) error {
	key := kubeletName(handle)
	k.pods[key]++
	if _, done := k.staged[key]; !done {
		if _, err := k.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: handle, StagingTargetPath: staging, VolumeCapability: c}); err != nil {
			return err
		}
		k.staged[key] = staging
	}
	// The staging path is the pod's volume's own (kubelet derives it from
	// the PV), staged there or not.
	_, err := k.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: handle, StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: c, VolumeContext: map[string]string{
			ctxPodNamespace: "default", ctxPodName: "pod-" + podUID, ctxPodUID: podUID}})
	return err
}

// tearDown is one pod gone: NodeUnpublishVolume of its target when it was
// published, then NodeUnstageVolume once the volume's last pod went.
func (k *kubeletVolumes) tearDown(ctx context.Context, handle, target string, published bool) error {
	key := kubeletName(handle)
	if published {
		if _, err := k.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: handle, TargetPath: target}); err != nil {
			return err
		}
	}
	if k.pods[key]--; k.pods[key] > 0 {
		return nil
	}
	staging, ok := k.staged[key]
	if !ok {
		return nil
	}
	if _, err := k.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: handle, StagingTargetPath: staging}); err != nil {
		return err
	}
	delete(k.staged, key)
	return nil
}

// TestRootShareManagerBesideRefusedWorkload is issue #33's first report on
// one node, with real loop devices and mounts, the test API server and the
// real fence: a workload pod of an RWX filesystem claim is refused
// (FailedPrecondition: no NFS client) and stays, retrying, while the share
// manager's pod stages and publishes the same volume as a raw block device
// through its own PV. With the claim's handle on that PV too, kubelet took
// the workload's stage for the share manager's and skipped its
// NodeStageVolume: its NodePublishVolume failed "volume is not staged on
// this node" for as long as the workload stayed. With its own handle the
// share manager's device is staged and published, the workload's unstage
// leaves it alone, and its own teardown leaves nothing: no loop device on
// the image, no Attachment (what the Volume's image deletion waits for).
func TestRootShareManagerBesideRefusedWorkload(t *testing.T) {
	const name = "rwx-beside-workload"
	image := filepath.Join(t.TempDir(), name+".img")
	if err := os.WriteFile(image, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(image, 64<<20); err != nil {
		t.Fatal(err)
	}
	f := rwxOnAPIServer(t, name, v1.ShareStarting, func(c *agent.Config) {
		c.Images = imageOf{id: name, path: image}
		c.Loop = mount.NewLoop(utilexec.New())
		c.Mounts = mount.NewManager(mount.NewMounter(), utilexec.New(), testr.New(t))
		c.NFS = nfsAnswer{mount.ErrNoNFSClient} // as on this machine, also where one is
	})
	t.Cleanup(func() { leaveNothing(t, f.kubelet, image) })
	ctx := apiCtx(t, 2*time.Minute)
	k := &kubeletVolumes{node: f.node, staged: map[string]string{}, pods: map[string]int{}}

	// The workload: kubelet's filesystem staging path of the claim's handle,
	// and the refusal before anything is made.
	rwx := csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
	workloadStaging := f.staging
	if err := k.setUp(ctx, name, workloadStaging, f.target, reqCap(rwx), "uid-web"); status.Code(err) != codes.FailedPrecondition ||
		!strings.Contains(err.Error(), "no kernel NFS client") {
		t.Fatalf("workload's publish: %v, want FailedPrecondition: no kernel NFS client", err)
	}

	// The share manager's pod, on the same node, through its PV's handle.
	handle := volid.ShareDevice(name)
	blockRoot := filepath.Join(f.kubelet, "plugins", "kubernetes.io", "csi", "volumeDevices")
	smStaging := filepath.Join(blockRoot, "staging", "share-manager-"+name)
	smTarget := filepath.Join(blockRoot, "publish", "share-manager-"+name, "uid-sm")
	device := capability(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, true, "")
	if err := k.setUp(ctx, handle, smStaging, smTarget, device, "uid-sm"); err != nil {
		t.Fatalf("share manager's stage and publish beside the refused workload: %v", err)
	}
	dev := stagedLoop(t, smStaging, image)
	if !sameDeviceAt(t, smTarget, dev) {
		t.Errorf("the share manager's target %s is not %s", smTarget, dev)
	}

	// The workload goes (its publish never succeeded): kubelet unstages its
	// stage; the share manager's device stays staged and published.
	if err := k.tearDown(ctx, name, f.target, false); err != nil {
		t.Fatalf("workload's unstage: %v", err)
	}
	if got := stagedLoop(t, smStaging, image); got != dev || !sameDeviceAt(t, smTarget, dev) {
		t.Errorf("after the workload's unstage the share manager's device is %q (was %s)", got, dev)
	}
	if e := attachmentEntries(t, name); len(e) != 2 {
		t.Errorf("Attachment entries after the workload's unstage: %+v, want the share manager's stage and pod", e)
	}

	// The share stops: nothing is left for the image's deletion to wait on.
	if err := k.tearDown(ctx, handle, smTarget, true); err != nil {
		t.Fatalf("share manager's unpublish and unstage: %v", err)
	}
	if d, found, err := mount.NewLoop(utilexec.New()).Find(ctx, image); err != nil || found {
		t.Errorf("a loop device (%q) is left on the image (%v)", d, err)
	}
	if e := attachmentEntries(t, name); len(e) != 0 {
		t.Errorf("Attachment entries left: %+v", e)
	}
}

// stagedLoop is the loop device staged at staging, which must be the one
// on image.
func stagedLoop(t *testing.T, staging, image string) string {
	t.Helper()
	dev, _, err := mount.NewManager(mount.NewMounter(), utilexec.New(), testr.New(t)).StagedDevice(t.Context(), staging)
	if err != nil {
		t.Fatal(err)
	}
	onImage, found, err := mount.NewLoop(utilexec.New()).Find(t.Context(), image)
	if err != nil || !found || dev != onImage {
		t.Fatalf("staged at %s: %q; loop device on the image: %q (%v, %v)", staging, dev, onImage, found, err)
	}
	return dev
}

// sameDeviceAt tells whether path is a device node of dev's number.
func sameDeviceAt(t *testing.T, path, dev string) bool {
	t.Helper()
	var a, b unix.Stat_t
	if err := unix.Stat(path, &a); err != nil {
		t.Errorf("stat %s: %v", path, err)
		return false
	}
	if err := unix.Stat(dev, &b); err != nil {
		t.Errorf("stat %s: %v", dev, err)
		return false
	}
	return a.Mode&unix.S_IFMT == unix.S_IFBLK && a.Rdev == b.Rdev
}

// leaveNothing undoes what a failed test left: mounts under kubelet's root
// (deepest first) and loop devices on image.
func leaveNothing(t *testing.T, kubelet, image string) {
	mis, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Errorf("mountinfo: %v", err)
		return
	}
	var points []string
	for _, line := range strings.Split(string(mis), "\n") {
		if fields := strings.Fields(line); len(fields) > 4 && strings.HasPrefix(fields[4], kubelet+"/") {
			points = append(points, fields[4])
		}
	}
	for i := len(points) - 1; i >= 0; i-- {
		t.Logf("left mounted: %s", points[i])
		if err := unix.Unmount(points[i], unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", points[i], err)
		}
	}
	out, err := exec.Command("losetup", "-l", "-n", "-O", "NAME", "-j", image).Output()
	if err != nil {
		t.Errorf("losetup -j %s: %v", image, err)
		return
	}
	for _, dev := range strings.Fields(string(out)) {
		t.Logf("left attached: %s", dev)
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v: %s", dev, err, out)
		}
	}
}
