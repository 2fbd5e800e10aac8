package csi

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr/testr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend"
)

// rwxCap is what an RWX PVC asks for: many nodes writing, a filesystem.
func rwxCap() *csi.VolumeCapability {
	return capability(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER, false, "ext4")
}

// localController is a CSI controller on the API server for StorageCluster
// "c" of the local backend, with node's reconcilers running, and the
// topology that puts volumes on node.
func localController(ctx context.Context, t *testing.T, node string) (*Controller, *csi.TopologyRequirement) {
	t.Helper()
	storageCluster(ctx, t, "c")
	images, err := backend.NewLocal(t.TempDir(), testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	runNodeReconcilers(t, node, images)
	s := apiController(t, ControllerConfig{Wait: 30 * time.Second})
	return s, &csi.TopologyRequirement{Preferred: []*csi.Topology{{Segments: map[string]string{v1.TopologyNodeKey: node}}}}
}

// TestRWXExpandSnapshotCloneLocal: an RWX volume of the local backend, made
// through the CSI controller with a real agent reconciler and backend,
// expands (the node step is asked for: the share manager's node grows the
// device and the share manager the filesystem), is snapshotted and cloned,
// and an RWX volume is restored from its snapshot, larger: each copy is an
// RWX filesystem Volume on the source's node holding the source's data.
func TestRWXExpandSnapshotCloneLocal(t *testing.T) {
	ctx := apiCtx(t, 2*time.Minute)
	const node = "rwx-copy-node"
	s, on := localController(ctx, t, node)
	params := map[string]string{v1.ParamStorageCluster: "c"}
	create := func(name string, c *csi.VolumeCapability, size int64, src *csi.VolumeContentSource) *csi.Volume {
		t.Helper()
		resp, err := s.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, Parameters: params, AccessibilityRequirements: on,
			CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{c}, VolumeContentSource: src})
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		t.Cleanup(func() {
			_, _ = s.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: resp.GetVolume().GetVolumeId()})
		})
		return resp.GetVolume()
	}
	volume := func(id string) *v1.Volume {
		t.Helper()
		vol := &v1.Volume{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: id}, vol); err != nil {
			t.Fatal(err)
		}
		return vol
	}

	src := create("rwx-src", rwxCap(), 16<<20, nil)
	srcVol := volume(src.GetVolumeId())
	if srcVol.Spec.AccessMode != v1.ReadWriteMany || srcVol.Spec.Node != node {
		t.Fatalf("source Volume: %s on %q, want ReadWriteMany on %s", srcVol.Spec.AccessMode, srcVol.Spec.Node, node)
	}
	data := make16MiB()
	if err := os.WriteFile(srcVol.Status.Path, data, 0o600); err != nil {
		t.Fatal(err)
	}

	grown, err := s.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: src.GetVolumeId(),
		CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20}, VolumeCapability: rwxCap()})
	if err != nil || grown.GetCapacityBytes() != 32<<20 || !grown.GetNodeExpansionRequired() {
		t.Fatalf("expand: %v, %v; want 32 MiB with the node step", grown, err)
	}
	if v := volume(src.GetVolumeId()); v.Status.Capacity == nil || v.Status.Capacity.Value() != 32<<20 {
		t.Errorf("capacity after expand %v, want 32 MiB (what the share manager's node grows the device to)", v.Status.Capacity)
	}

	snap, err := s.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "rwx-src-snap", SourceVolumeId: src.GetVolumeId()})
	if err != nil {
		t.Fatalf("snapshot of an RWX volume: %v", err)
	}
	t.Cleanup(func() {
		_, _ = s.DeleteSnapshot(context.Background(), &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()})
	})
	if !snap.GetSnapshot().GetReadyToUse() || snap.GetSnapshot().GetSizeBytes() != 32<<20 {
		t.Errorf("snapshot %v: want ready, 32 MiB", snap.GetSnapshot())
	}
	fromSnap := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()}}}
	fromVol := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
		Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.GetVolumeId()}}}
	for _, tc := range []struct {
		name string
		c    *csi.VolumeCapability
		size int64
		src  *csi.VolumeContentSource
		mode v1.AccessMode
	}{
		{"rwx-restored", rwxCap(), 48 << 20, fromSnap, v1.ReadWriteMany},
		{"rwx-clone", rwxCap(), 32 << 20, fromVol, v1.ReadWriteMany},
		{"rwo-from-rwx", reqCap(rwo), 32 << 20, fromSnap, v1.ReadWriteOnce},
	} {
		got := create(tc.name, tc.c, tc.size, tc.src)
		v := volume(got.GetVolumeId())
		if got.GetCapacityBytes() != tc.size || v.Spec.AccessMode != tc.mode || v.Spec.VolumeMode != v1.VolumeModeFilesystem || v.Spec.Node != node {
			t.Errorf("%s: %d bytes, %s %s on %q; want %d, %s Filesystem on %s", tc.name, got.GetCapacityBytes(),
				v.Spec.AccessMode, v.Spec.VolumeMode, v.Spec.Node, tc.size, tc.mode, node)
		}
		img, err := os.ReadFile(v.Status.Path)
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(img)) != tc.size || !bytes.Equal(img[:len(data)], data) {
			t.Errorf("%s: image of %d bytes does not hold the source's data", tc.name, len(img))
		}
	}
}

// TestRWXRootSquashParameter: the class parameter rootSquash "true" makes
// the Volume's share squash root; without it the share does not.
func TestRWXRootSquashParameter(t *testing.T) {
	ctx := apiCtx(t, time.Minute)
	s, on := localController(ctx, t, "rwx-squash-node")
	for name, want := range map[string]bool{"rwx-squash": true, "rwx-nosquash": false} {
		params := map[string]string{v1.ParamStorageCluster: "c"}
		if want {
			params[ParamRootSquash] = "true"
		}
		resp, err := s.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, Parameters: params, AccessibilityRequirements: on,
			CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20}, VolumeCapabilities: []*csi.VolumeCapability{rwxCap()}})
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		t.Cleanup(func() {
			_, _ = s.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: resp.GetVolume().GetVolumeId()})
		})
		vol := &v1.Volume{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: resp.GetVolume().GetVolumeId()}, vol); err != nil {
			t.Fatal(err)
		}
		if vol.Spec.RootSquash != want {
			t.Errorf("%s: Volume spec.rootSquash %t, want %t", name, vol.Spec.RootSquash, want)
		}
	}
}
