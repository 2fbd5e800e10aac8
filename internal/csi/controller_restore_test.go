package csi

import (
	"context"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// TestRestoreChecksVolumeMode: a snapshot of a block volume is not restored
// into a filesystem volume, nor the reverse, as for clones; the mode comes
// from the snapshot, or, for one that lacks it, from its source volume.
// Nothing is made for a refused restore.
func TestRestoreChecksVolumeMode(t *testing.T) {
	ctx := apiCtx(t, time.Minute)
	storageCluster(ctx, t, "c")
	src := &v1.Volume{
		ObjectMeta: metav1.ObjectMeta{Name: "restore-src-block"},
		Spec: v1.VolumeSpec{StorageCluster: "c", Size: resource.MustParse("4Mi"), AccessMode: v1.ReadWriteOnce,
			VolumeMode: v1.VolumeModeBlock, Node: "restore-node"},
	}
	create(ctx, t, src)
	readySnapshot(ctx, t, "restore-snap-block", src.Name, v1.VolumeModeBlock)
	readySnapshot(ctx, t, "restore-snap-old", src.Name, "") // taken before the mode was recorded

	s := NewController(env.Client, ControllerConfig{Wait: 2 * time.Second}, testr.New(t))
	fsCap := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	for _, snap := range []string{"restore-snap-block", "restore-snap-old"} {
		_, err := s.CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: "restore-of-" + snap, VolumeCapabilities: []*csi.VolumeCapability{fsCap},
			Parameters: map[string]string{v1.ParamStorageCluster: "c"},
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
				Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap}}},
		})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("filesystem volume from block snapshot %s: %v, want InvalidArgument", snap, err)
		}
		made := &v1.Volume{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: objectName("vol", "restore-of-"+snap)}, made); err == nil {
			t.Errorf("a refused restore made Volume %s", made.Name)
			_ = env.Client.Delete(context.Background(), made)
		}
	}
}

// readySnapshot makes a Snapshot object that reads as taken; it goes when
// the test ends.
func readySnapshot(ctx context.Context, t *testing.T, name, source string, mode v1.VolumeMode) {
	t.Helper()
	snap := &v1.Snapshot{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1.SnapshotSpec{SourceVolume: source, Node: "restore-node", VolumeMode: mode},
	}
	create(ctx, t, snap)
	snap.Status = v1.SnapshotStatus{ReadyToUse: true, Size: resource.NewQuantity(4<<20, resource.BinarySI)}
	if err := env.Client.Status().Update(ctx, snap); err != nil {
		t.Fatal(err)
	}
}
