package userspace

import (
	"context"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// cephCluster makes a ceph StorageCluster; the tests hand its client to
// NodeStageVolume as kubelet does from the class's node-stage secret.
func (f *fixture) cephCluster(t *testing.T, name, monitors, pool string) {
	t.Helper()
	sc := &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.StorageClusterSpec{
		Backend: v1.BackendCeph, DataDir: "/srv/berth",
		Ceph: &v1.CephSpec{Monitors: []v1.CephMonitor{v1.CephMonitor(monitors)}, Pool: pool,
			SecretRef: v1.CephSecretReference{Name: name, Namespace: "default"}},
	}}
	if err := f.env.Client.Create(context.Background(), sc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.env.Client.Delete(context.Background(), sc) })
}

// cephVolume makes the Volume of RBD image path (POOL/IMAGE) as the CSI
// controller records a ceph volume: no node, Available, the image's size.
func (f *fixture) cephVolume(t *testing.T, name, cluster, path, size string, mounter v1.Mounter) *v1.Volume {
	t.Helper()
	ctx := context.Background()
	vol := &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.VolumeSpec{StorageCluster: cluster,
		Size: resource.MustParse(size), AccessMode: v1.ReadWriteOnce, FSType: "ext4", Mounter: mounter}}
	if err := f.env.Client.Create(ctx, vol); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.env.Client.Delete(context.Background(), vol) })
	capacity := resource.MustParse(size)
	vol.Status = v1.VolumeStatus{State: v1.VolumeAvailable, Path: path, Capacity: &capacity}
	if err := f.env.Client.Status().Update(ctx, vol); err != nil {
		t.Fatal(err)
	}
	return vol
}

// stageCeph stages m (a filesystem of fsType) as kubelet does, with the
// cephx client as secrets.
func stageCeph(nc csi.NodeClient, m mounted, fsType string, secrets map[string]string) error {
	return retryBusy(func() error {
		_, err := nc.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{VolumeId: m.name, StagingTargetPath: m.staging,
			VolumeCapability: mountCapFS(fsType), Secrets: secrets})
		return err
	})
}

// A ceph volume with mounter kernel needs krbd, which this kernel lacks:
// refused with FailedPrecondition naming the module, before anything is
// made. No Ceph is needed to be refused.
func TestCephKernelMounterRefused(t *testing.T) {
	f := setup(t)
	nc := f.node(t)
	f.cephCluster(t, "ceph-krbd", "127.0.0.1:1", "rbd")
	f.cephVolume(t, "ceph-krbd-1", "ceph-krbd", "rbd/berth-ceph-krbd-1", "64Mi", v1.MounterKernel)
	m := f.paths(t, "ceph-krbd-1")
	err := stageCeph(nc, m, "ext4", map[string]string{"userID": "berth", "userKey": "AQBfakefakefakefakefakefakefakefakefake=="})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "rbd module") || !strings.Contains(err.Error(), "krbd") {
		t.Fatalf("stage: %v, want FailedPrecondition naming the missing rbd module", err)
	}
	if strings.Contains(err.Error(), "AQBfake") {
		t.Error("the refusal shows the key")
	}
	f.leftNothing(t, m.name, "")
}
