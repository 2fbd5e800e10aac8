package sanity

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/testenv"
)

// holdFinalizer keeps a deleted StorageCluster in its deleting state for
// as long as a test needs it.
const holdFinalizer = "test.berth.io/hold"

// TestStageRefusedWhileClusterDeleting: NodeStage of a volume whose
// StorageCluster is being deleted answers FailedPrecondition naming the
// cluster, and makes no mount, loop device or Attachment.
func TestStageRefusedWhileClusterDeleting(t *testing.T) {
	c := dial(t)
	ctx := testCtx(t)
	sc := &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "doomed-csi", Finalizers: []string{holdFinalizer}},
		Spec: v1.StorageClusterSpec{DataDir: drv.dataDir}}
	if err := drv.env.Client.Create(ctx, sc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if err := drv.env.Client.Get(ctx, client.ObjectKeyFromObject(sc), sc); err == nil {
			sc.Finalizers = nil
			_ = drv.env.Client.Update(ctx, sc)
		}
	})
	image := nodeVolume(t, "doomed-csi-vol", sc.Name)
	if err := drv.env.Client.Delete(ctx, sc); err != nil {
		t.Fatal(err)
	}

	staging, _ := kubeletDirs(t)
	_, err := c.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "doomed-csi-vol", StagingTargetPath: staging, VolumeCapability: mountCap()})
	wantCode(t, "stage while the cluster is being deleted", err, codes.FailedPrecondition)
	if !strings.Contains(status.Convert(err).Message(), sc.Name) {
		t.Errorf("refusal does not name the cluster %s: %v", sc.Name, err)
	}
	if n := mountsAt(t, staging); n != 0 {
		t.Errorf("%d mounts at the refused staging path", n)
	}
	if loops := testenv.LoopsOf(t, image); len(loops) != 0 {
		t.Errorf("refused stage left loop devices %v", loops)
	}
	if err := drv.env.Client.Get(ctx, client.ObjectKey{Name: "doomed-csi-vol"}, &v1.Attachment{}); !apierrors.IsNotFound(err) {
		t.Errorf("refused stage left an Attachment (%v)", err)
	}
}

// nodeVolume makes a Volume of cluster on the driver's node, waits for its
// image and returns the image path; the Volume goes when the test ends.
func nodeVolume(t *testing.T, name, cluster string) string {
	t.Helper()
	ctx := context.Background()
	vol := &v1.Volume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1.NodeLabel: nodeName}},
		Spec: v1.VolumeSpec{StorageCluster: cluster, Size: resource.MustParse("16Mi"), AccessMode: v1.ReadWriteOnce,
			FSType: "ext4", Node: nodeName},
	}
	if err := drv.env.Client.Create(ctx, vol); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = drv.env.Client.Delete(ctx, vol)
		for range 300 {
			if err := drv.env.Client.Get(ctx, client.ObjectKeyFromObject(vol), vol); apierrors.IsNotFound(err) {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("volume %s not deleted by the agent", name)
	})
	for range 300 {
		if err := drv.env.Client.Get(ctx, client.ObjectKeyFromObject(vol), vol); err == nil && vol.Status.State == v1.VolumeAvailable {
			return vol.Status.Path
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("volume %s not made by the agent: %+v", name, vol.Status)
	return ""
}
