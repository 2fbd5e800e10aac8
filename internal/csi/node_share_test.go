package csi

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"k8s.io/utils/exec"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/agent"
	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/mount"
	"github.com/berth-io/berth/internal/volid"
)

type nfsAnswer struct{ err error }

func (n nfsAnswer) Check() error { return n.err }

// The CSI node service on an RWX filesystem volume, with fakes (mount-utils'
// FakeMounter, a recording loop and fence): stage makes nothing, publish is
// refused with FailedPrecondition before anything is made on a node without
// an NFS client, and otherwise mounts the running share's endpoint over NFS.
func TestNodeRWXFilesystem(t *testing.T) {
	rwx := csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
	setup := func(t *testing.T, nfsErr error) *nodeFixture {
		f := newNodeFixtureOf(t, func(c *agent.Config) {
			c.NFS = nfsAnswer{nfsErr}
			c.Images = imageOf{id: "vol-x", path: filepath.Join(t.TempDir(), "vol-x.img")}
		})
		vol := &v1.Volume{
			ObjectMeta: metav1.ObjectMeta{Name: "vol-x"},
			Spec: v1.VolumeSpec{StorageCluster: "c", AccessMode: v1.ReadWriteMany,
				VolumeMode: v1.VolumeModeFilesystem, FSType: "ext4", Node: "node-b"},
		}
		// The fixture's fake API has no status subresource: status is kept.
		vol.Status.ShareState, vol.Status.ShareEndpoint = v1.ShareRunning, "nfs://share-manager-vol-x.berth-system.svc/vol-x"
		vol.Status.ShareNodes = []string{"node-a"} // the fixture agent's node
		if err := f.api.Create(t.Context(), vol); err != nil {
			t.Fatal(err)
		}
		_, err := f.node.NodeStageVolume(t.Context(), &csi.NodeStageVolumeRequest{VolumeId: "vol-x", StagingTargetPath: f.staging,
			VolumeCapability: reqCap(rwx)})
		if err != nil {
			t.Fatalf("stage: %v", err)
		}
		if len(f.loop.calls)+len(f.fence.calls) != 0 {
			t.Fatalf("stage of a shared volume: loop %v, fence %v", f.loop.calls, f.fence.calls)
		}
		return f
	}
	publish := func(t *testing.T, f *nodeFixture) error {
		_, err := f.node.NodePublishVolume(t.Context(), &csi.NodePublishVolumeRequest{VolumeId: "vol-x", StagingTargetPath: f.staging,
			TargetPath: f.target, VolumeCapability: reqCap(rwx), VolumeContext: map[string]string{
				ctxPodNamespace: "default", ctxPodName: "web-0", ctxPodUID: "uid-0"}})
		return err
	}

	t.Run("no NFS client", func(t *testing.T) {
		f := setup(t, mount.ErrNoNFSClient)
		err := publish(t, f)
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "no kernel NFS client") {
			t.Fatalf("publish: %v, want FailedPrecondition saying the node has no NFS client", err)
		}
		mps, _ := f.mounter.List()
		if _, serr := os.Stat(f.target); len(f.fence.calls) != 0 || len(mps) != 0 || !os.IsNotExist(serr) {
			t.Errorf("refused publish left: fence %v, mounts %v, target %v", f.fence.calls, mps, serr)
		}
	})
	t.Run("share running", func(t *testing.T) {
		f := setup(t, nil)
		if err := publish(t, f); err != nil {
			t.Fatalf("publish: %v", err)
		}
		mps, _ := f.mounter.List()
		if len(mps) != 1 || mps[0].Device != "share-manager-vol-x.berth-system.svc:/vol-x" || mps[0].Type != "nfs4" ||
			!slices.Contains(mps[0].Opts, "hard") {
			t.Fatalf("mounts %+v", mps)
		}
		if _, err := f.node.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-x", TargetPath: f.target}); err != nil {
			t.Fatalf("unpublish: %v", err)
		}
		if _, err := f.node.NodeUnstageVolume(t.Context(), &csi.NodeUnstageVolumeRequest{VolumeId: "vol-x", StagingTargetPath: f.staging}); err != nil {
			t.Fatalf("unstage: %v", err)
		}
		if want := []string{"acquire vol-x", "release vol-x"}; !slices.Equal(f.fence.calls, want) || len(f.loop.calls) != 0 {
			t.Errorf("fence %v (want %v), loop %v", f.fence.calls, want, f.loop.calls)
		}
	})
	// kubelet's NodeExpandVolume after a workload's PVC grew: the publish is
	// an NFS mount, so it succeeds with the image's size and touches no
	// device and runs no resize (the fixture fails any command run); the
	// share manager grows the filesystem on its own node.
	t.Run("expand is the share manager's", func(t *testing.T) {
		f := setup(t, nil)
		if err := publish(t, f); err != nil {
			t.Fatalf("publish: %v", err)
		}
		resp, err := f.node.NodeExpandVolume(t.Context(), &csi.NodeExpandVolumeRequest{VolumeId: "vol-x", VolumePath: f.target,
			StagingTargetPath: f.staging, VolumeCapability: reqCap(rwx), CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20}})
		if err != nil {
			t.Fatalf("expand of a workload's NFS publish: %v", err)
		}
		if resp.GetCapacityBytes() != 64<<20 {
			t.Errorf("capacity %d, want the image's %d", resp.GetCapacityBytes(), 64<<20)
		}
		if len(f.loop.calls) != 0 {
			t.Errorf("expand of an NFS publish touched a device: %v", f.loop.calls)
		}
		if mps, _ := f.mounter.List(); len(mps) != 1 || mps[0].Type != "nfs4" {
			t.Errorf("mounts after expand %+v", mps)
		}
	})
}

// rwxOnAPIServer is the node fixture over the test API server and the real
// fence, with an RWX filesystem Volume name in it (its share in state).
func rwxOnAPIServer(t *testing.T, name string, state v1.ShareState, edit func(*agent.Config)) *nodeFixture {
	t.Helper()
	ctx := apiCtx(t, time.Minute)
	vol := &v1.Volume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1.VolumeSpec{StorageCluster: "c", Size: resource.MustParse("64Mi"), AccessMode: v1.ReadWriteMany, VolumeMode: v1.VolumeModeFilesystem, FSType: "ext4"},
	}
	create(ctx, t, vol)
	t.Cleanup(func() { _ = env.Client.Delete(ctx, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: name}}) })
	setShare(t, name, state)
	return newNodeFixtureOf(t, func(c *agent.Config) {
		c.API = env.Client
		c.Fence = fence.New(env.Client, record.NewFakeRecorder(16), clock.RealClock{}, testr.New(t), fence.Options{})
		edit(c)
	})
}

func setShare(t *testing.T, name string, state v1.ShareState) {
	t.Helper()
	vol := &v1.Volume{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Name: name}, vol); err != nil {
		t.Fatal(err)
	}
	vol.Status.ShareState, vol.Status.ShareEndpoint = state, ""
	if state == v1.ShareRunning {
		vol.Status.ShareEndpoint = "nfs://share-manager-" + name + ".berth-system.svc/" + name
		vol.Status.ShareNodes = []string{"node-a"}
	}
	if err := env.Client.Status().Update(t.Context(), vol); err != nil {
		t.Fatal(err)
	}
}

func publishPod(t *testing.T, f *nodeFixture, name string) error {
	t.Helper()
	_, err := f.node.NodePublishVolume(t.Context(), &csi.NodePublishVolumeRequest{VolumeId: name, StagingTargetPath: f.staging,
		TargetPath: f.target, VolumeCapability: reqCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER),
		VolumeContext: map[string]string{ctxPodNamespace: "default", ctxPodName: "web-0", ctxPodUID: "uid-0"}})
	return err
}

func attachmentEntries(t *testing.T, name string) []v1.AttachmentEntry {
	t.Helper()
	att := &v1.Attachment{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Name: name}, att); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		t.Fatal(err)
	}
	return att.Spec.Attachments
}

// TestRWXPublishRefusedLeavesNothing: on this node (no kernel NFS client)
// a workload's publish of a running share is refused with
// FailedPrecondition by the real check, before the real fence writes an
// Attachment or the real mounter makes anything.
func TestRWXPublishRefusedLeavesNothing(t *testing.T) {
	suite.Require(t)
	if mount.HostNFSClient().Check() == nil {
		t.Skip("this node has a kernel NFS client: the refusal cannot happen here")
	}
	f := rwxOnAPIServer(t, "rwx-refused", v1.ShareRunning, func(c *agent.Config) {
		c.Mounts = mount.NewManager(mount.NewMounter(), exec.New(), testr.New(t))
	})
	err := publishPod(t, f, "rwx-refused")
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("publish: %v, want FailedPrecondition", err)
	}
	t.Logf("refused: %v", err)
	if e := attachmentEntries(t, "rwx-refused"); len(e) != 0 {
		t.Errorf("refused publish left Attachment entries %+v", e)
	}
	if _, err := os.Stat(f.target); !os.IsNotExist(err) {
		t.Errorf("refused publish made the target: %v", err)
	}
}

// TestRWXPublishRecordsWorkload: the pod's entry is in the real Attachment
// while the share starts (what makes the share manager needed), publish
// mounts once the share runs, and unpublish drops the entry.
func TestRWXPublishRecordsWorkload(t *testing.T) {
	suite.Require(t)
	const name = "rwx-workload"
	f := rwxOnAPIServer(t, name, v1.ShareStarting, func(c *agent.Config) {
		c.NFS, c.ShareWait = nfsAnswer{}, 300*time.Millisecond
	})
	if err := publishPod(t, f, name); status.Code(err) != codes.Unavailable {
		t.Fatalf("publish while the share starts: %v, want Unavailable", err)
	}
	if e := attachmentEntries(t, name); len(e) != 1 || e[0].Pod != "web-0" || e[0].IsStage() {
		t.Fatalf("Attachment entries %+v, want the pod's", e)
	}
	setShare(t, name, v1.ShareRunning)
	if err := publishPod(t, f, name); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if mps, _ := f.mounter.List(); len(mps) != 1 || mps[0].Type != "nfs4" {
		t.Fatalf("mounts %+v", mps)
	}
	if _, err := f.node.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: name, TargetPath: f.target}); err != nil {
		t.Fatalf("unpublish: %v", err)
	}
	if e := attachmentEntries(t, name); len(e) != 0 {
		t.Errorf("Attachment entries after unpublish: %+v", e)
	}
}

// TestShareManagerStageIsSoleDeviceHolder: the share manager's stage of an
// RWX filesystem volume (a block request) holds the device on one node
// only: while another live node has it staged, the stage is refused with
// FailedPrecondition by the real fence, before any device is attached.
func TestShareManagerStageIsSoleDeviceHolder(t *testing.T) {
	suite.Require(t)
	const name = "rwx-sole-device"
	f := rwxOnAPIServer(t, name, v1.ShareStarting, func(c *agent.Config) {
		c.Images = imageOf{id: name, path: filepath.Join(t.TempDir(), name+".img")}
	})
	ctx := apiCtx(t, time.Minute)
	create(ctx, t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-other"}})
	staged := "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/staging/share-manager-" + name
	att := &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.AttachmentSpec{AccessMode: v1.ReadWriteMany,
		Attachments: []v1.AttachmentEntry{{Node: "node-other", MountDir: staged, StagingPath: staged}}}}
	create(ctx, t, att)
	_, err := f.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: name, StagingTargetPath: f.staging,
		VolumeCapability: capability(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, true, "")})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "node-other") {
		t.Fatalf("stage while node-other holds the device: %v, want FailedPrecondition naming node-other", err)
	}
	if len(f.loop.calls) != 0 {
		t.Errorf("a refused stage attached: %v", f.loop.calls)
	}
	if got := attachmentEntries(t, name); len(got) != 1 || got[0].Node != "node-other" {
		t.Errorf("entries after the refusal: %+v", got)
	}
}

// imageOf is oneImage for the volume id.
type imageOf struct {
	oneImage
	id, path string
}

func (o imageOf) Get(_ context.Context, id string) (backend.Image, error) {
	if id != o.id {
		return backend.Image{}, backend.ErrNotFound
	}
	return backend.Image{ID: id, Path: o.path, Size: 64 << 20}, nil
}

// The share manager's handle names only its block device: a filesystem
// request through it, or one for a volume that is not shared, is refused
// with InvalidArgument before anything is made.
func TestShareDeviceHandleIsBlockOfSharedVolumeOnly(t *testing.T) {
	const name = "rwx-handle-refused"
	f := rwxOnAPIServer(t, name, v1.ShareStarting, func(c *agent.Config) {
		c.Images = imageOf{id: name, path: filepath.Join(t.TempDir(), name+".img")}
	})
	ctx := apiCtx(t, time.Minute)
	rwo := &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: name + "-rwo"}, Spec: v1.VolumeSpec{StorageCluster: "c",
		Size: resource.MustParse("64Mi"), AccessMode: v1.ReadWriteOnce, VolumeMode: v1.VolumeModeFilesystem, FSType: "ext4"}}
	create(ctx, t, rwo)
	for _, c := range []struct {
		what string
		id   string
		cap  *csi.VolumeCapability
	}{
		{"filesystem of a shared volume", volid.ShareDevice(name), reqCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)},
		{"block of a ReadWriteOnce volume", volid.ShareDevice(rwo.Name), capability(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, true, "")},
	} {
		_, err := f.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: c.id, StagingTargetPath: f.staging, VolumeCapability: c.cap})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("stage, %s: %v, want InvalidArgument", c.what, err)
		}
		_, err = f.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: c.id, StagingTargetPath: f.staging,
			TargetPath: f.target, VolumeCapability: c.cap})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("publish, %s: %v, want InvalidArgument", c.what, err)
		}
	}
	if len(f.loop.calls) != 0 || len(attachmentEntries(t, name)) != 0 || len(attachmentEntries(t, rwo.Name)) != 0 {
		t.Errorf("refused requests made: loop %v, Attachments %+v %+v", f.loop.calls, attachmentEntries(t, name), attachmentEntries(t, rwo.Name))
	}
}
