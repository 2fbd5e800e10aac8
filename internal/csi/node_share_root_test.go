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

// kubeletVolumes plays the rules of kubelet's volume manager (v1.34) that
// issue #33 ran into, over the real node service:
//   - a node's volume state is keyed by driver^handle
//     (k8s.io/kubernetes pkg/volume/csi/csi_plugin.go GetVolumeName), and
//     keeps the spec (filesystem or block) of the pod that added it;
//   - the device is staged for a pod unless that state is already
//     DeviceGloballyMounted: MountVolume skips MountDevice and MapVolume
//     skips SetUpDevice (pkg/volume/util/operationexecutor/
//     operation_generator.go); a filesystem stage records its staging
//     path (and kubelet's vol_data.json beside it), a block one its global
//     map path;
//   - once the last pod went the device is torn down by the kept spec
//     (operation_executor.go UnmountDevice): a block one at its staging
//     path; a filesystem one by csiAttacher.UnmountDevice, which sends
//     NodeUnstageVolume only when it finds vol_data.json beside the
//     recorded path, and else skips it as done;
//   - a failed unstage leaves the state DeviceMountUncertain, retried
//     while no pod wants the volume.
type kubeletVolumes struct {
	node *Node
	vols map[string]*kubeletVolume
}

// kubeletVolume is the state of one driver^handle on the node.
type kubeletVolume struct {
	podVolume        // of the pod that added it
	state     string // "", mounted, uncertain
	device    string // the recorded device mount path
	data      string // the path whose folder holds vol_data.json ("": none)
	pods      int
}

// podVolume is a pod's volume as kubelet derives it from the pod's PV.
type podVolume struct {
	handle    string
	block     bool
	staging   string // the PV's staging path
	globalMap string // block: the PV's global map path
	target    string
	podUID    string
	cap       *csi.VolumeCapability
}

const (
	deviceMounted   = "mounted"
	deviceUncertain = "uncertain"
)

func kubeletName(handle string) string { return "kubernetes.io/csi/" + v1.DriverName + "^" + handle }

// setUp is one pod's MountVolume (MapVolume for block).
func (k *kubeletVolumes) setUp(ctx context.Context, pv podVolume) error {
	key := kubeletName(pv.handle)
	v := k.vols[key]
	if v == nil {
		v = &kubeletVolume{podVolume: pv}
		k.vols[key] = v
	}
	v.pods++
	if v.state != deviceMounted {
		_, err := k.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: pv.handle, StagingTargetPath: pv.staging, VolumeCapability: pv.cap})
		if err != nil {
			return err
		}
		v.state, v.device, v.data = deviceMounted, pv.staging, pv.staging
		if pv.block {
			v.device, v.data = pv.globalMap, ""
		}
	}
	_, err := k.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: pv.handle, StagingTargetPath: pv.staging,
		TargetPath: pv.target, VolumeCapability: pv.cap, VolumeContext: map[string]string{
			ctxPodNamespace: "default", ctxPodName: "pod-" + pv.podUID, ctxPodUID: pv.podUID}})
	return err
}

// tearDown is one pod gone: NodeUnpublishVolume of its target when it was
// published, then the device's teardown once the volume's last pod went.
func (k *kubeletVolumes) tearDown(ctx context.Context, pv podVolume, published bool) error {
	if published {
		if _, err := k.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: pv.handle, TargetPath: pv.target}); err != nil {
			return err
		}
	}
	k.vols[kubeletName(pv.handle)].pods--
	return k.settle(ctx)
}

// settle tears down every device no pod wants, as kubelet's reconciler does.
func (k *kubeletVolumes) settle(ctx context.Context) error {
	for key, v := range k.vols {
		if v.pods > 0 {
			continue
		}
		var err error
		switch {
		case v.state == "":
		case v.block:
			_, err = k.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.handle, StagingTargetPath: v.staging})
		case v.data == v.device:
			_, err = k.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.handle, StagingTargetPath: v.device})
		}
		if err != nil {
			v.state = deviceUncertain
			return err
		}
		delete(k.vols, key)
	}
	return nil
}

// rwxBesideWorkload is an RWX filesystem volume on this node with real
// loop devices and mounts, the test API server and the real fence, the
// node's kubelet, and its two pods' volumes: a workload's of the claim
// (refused: no NFS client, as on this machine, also where one is) and the
// share manager's through its PV.
type rwxBesideWorkload struct {
	f            *nodeFixture
	k            *kubeletVolumes
	image        string
	workload, sm podVolume
}

func newRWXBesideWorkload(t *testing.T, name string) *rwxBesideWorkload {
	t.Helper()
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
		c.NFS = nfsAnswer{mount.ErrNoNFSClient}
	})
	t.Cleanup(func() { leaveNothing(t, f.kubelet, image) })
	blockRoot := filepath.Join(f.kubelet, "plugins", "kubernetes.io", "csi", "volumeDevices")
	smPV := "share-manager-" + name
	return &rwxBesideWorkload{
		f: f, k: &kubeletVolumes{node: f.node, vols: map[string]*kubeletVolume{}}, image: image,
		workload: podVolume{handle: name, staging: f.staging, target: f.target, podUID: "uid-web",
			cap: reqCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)},
		// The share manager's PV as the operator makes it.
		sm: podVolume{handle: volid.ShareDevice(name), block: true, staging: filepath.Join(blockRoot, "staging", smPV),
			globalMap: filepath.Join(blockRoot, smPV, "dev"), target: filepath.Join(blockRoot, "publish", smPV, "uid-sm"), podUID: "uid-sm",
			cap: capability(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, true, "")},
	}
}

// refusedWorkload sets the workload's volume up: staged, publish refused.
func (e *rwxBesideWorkload) refusedWorkload(ctx context.Context, t *testing.T) {
	t.Helper()
	if err := e.k.setUp(ctx, e.workload); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "no kernel NFS client") {
		t.Fatalf("workload's publish: %v, want FailedPrecondition: no kernel NFS client", err)
	}
}

// shareRuns sets the share manager's volume up and checks that its device
// is the image's loop device, staged and published.
func (e *rwxBesideWorkload) shareRuns(ctx context.Context, t *testing.T) {
	t.Helper()
	if err := e.k.setUp(ctx, e.sm); err != nil {
		t.Fatalf("share manager's stage and publish beside the workload: %v", err)
	}
	if dev := stagedLoop(t, e.sm.staging, e.image); !sameDeviceAt(t, e.sm.target, dev) {
		t.Errorf("the share manager's target %s is not %s", e.sm.target, dev)
	}
	// kubelet's volume stats of the pod's device, by the same handle.
	st, err := e.f.node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: e.sm.handle, VolumePath: e.sm.target})
	if err != nil || len(st.GetUsage()) != 1 || st.GetUsage()[0].GetTotal() != 64<<20 {
		t.Errorf("stats of the share manager's device: %v, %v; want its 64 MiB", st.GetUsage(), err)
	}
}

// shareStops tears the share manager's volume down and checks that
// nothing is left that the Volume's image deletion waits for: a loop
// device on the image, an Attachment entry.
func (e *rwxBesideWorkload) shareStops(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	if err := e.k.tearDown(ctx, e.sm, true); err != nil {
		t.Fatalf("share manager's teardown: %v", err)
	}
	if d, found, err := mount.NewLoop(utilexec.New()).Find(ctx, e.image); err != nil || found {
		t.Errorf("a loop device (%q) is left on the image (%v): the Volume's image deletion waits for it", d, err)
	}
	if got := attachmentEntries(t, name); len(got) != 0 {
		t.Errorf("Attachment entries left: %+v: the Volume's image deletion waits for them", got)
	}
}

// TestRootShareManagerBesideRefusedWorkload is issue #33's first report on
// one node: a workload pod of an RWX claim is refused and stays, retrying,
// while the share manager's pod comes up. With the claim's handle on the
// share manager's PV, kubelet took the workload's stage for the share
// manager's and skipped its NodeStageVolume: its NodePublishVolume failed
// "volume is not staged on this node" for as long as the workload stayed.
// With its own handle the device is staged and published, the workload's
// unstage leaves it alone, and the share's teardown leaves nothing.
func TestRootShareManagerBesideRefusedWorkload(t *testing.T) {
	const name = "rwx-beside-workload"
	e := newRWXBesideWorkload(t, name)
	ctx := apiCtx(t, 2*time.Minute)
	e.refusedWorkload(ctx, t)
	e.shareRuns(ctx, t)
	if err := e.k.tearDown(ctx, e.workload, false); err != nil {
		t.Fatalf("workload's unstage: %v", err)
	}
	if got := stagedLoop(t, e.sm.staging, e.image); !sameDeviceAt(t, e.sm.target, got) {
		t.Errorf("after the workload's unstage the share manager's device %s is not at %s", got, e.sm.target)
	}
	if got := attachmentEntries(t, name); len(got) != 2 {
		t.Errorf("Attachment entries after the workload's unstage: %+v, want the share manager's stage and pod", got)
	}
	e.shareStops(ctx, t, name)
}

// TestRootShareTeardownAfterWorkloadUnstageFailed is issue #33's second
// report: the share ran and stopped, the claim was deleted, and the
// Volume stayed. The workload's unstage failed once (here: another
// operation held the volume, Aborted), so kubelet kept the volume's state,
// uncertain, with the workload's filesystem spec; the share manager's pod
// came meanwhile. With the claim's handle on its PV that was the same
// state: its stage ran (uncertain is not staged) and the share served, but
// kubelet tore it down by the kept filesystem spec, found no vol_data.json
// beside the block map path and never sent NodeUnstageVolume. The device
// stayed staged and the Attachment held, which the Volume's image deletion
// waits for. With its own handle each is torn down by its own spec.
func TestRootShareTeardownAfterWorkloadUnstageFailed(t *testing.T) {
	const name = "rwx-after-failed-unstage"
	e := newRWXBesideWorkload(t, name)
	ctx := apiCtx(t, 2*time.Minute)
	e.refusedWorkload(ctx, t)
	locks := e.f.node.agent.Locks()
	if !locks.TryLock(name) {
		t.Fatal("the volume's lock is held")
	}
	err := e.k.tearDown(ctx, e.workload, false)
	locks.Unlock(name)
	if status.Code(err) != codes.Aborted {
		t.Fatalf("workload's unstage while another operation holds the volume: %v, want Aborted", err)
	}
	e.shareRuns(ctx, t)
	if err := e.k.settle(ctx); err != nil {
		t.Fatalf("workload's unstage retried: %v", err)
	}
	e.shareStops(ctx, t, name)
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
