package csi

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/agent"
	"github.com/berth-io/berth/internal/mount"
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
		f := newNodeFixtureOf(t, func(c *agent.Config) { c.NFS = nfsAnswer{nfsErr} })
		vol := &v1.Volume{
			ObjectMeta: metav1.ObjectMeta{Name: "vol-x"},
			Spec: v1.VolumeSpec{StorageCluster: "c", AccessMode: v1.ReadWriteMany,
				VolumeMode: v1.VolumeModeFilesystem, FSType: "ext4", Node: "node-b"},
		}
		// The fixture's fake API has no status subresource: status is kept.
		vol.Status.ShareState, vol.Status.ShareEndpoint = v1.ShareRunning, "nfs://share-manager-vol-x.berth-system.svc/vol-x"
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
}
