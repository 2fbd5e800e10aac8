//go:build ceph

package csi

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/testenv/testceph"
)

// The CSI tests' own test Ceph (folder and ports apart from the backend's
// and the operator's), started by the first test that needs it.
var cephLazy = &testceph.Lazy{Name: "csi", Options: testceph.Options{Dir: "/var/lib/berth-ceph-csi-test", Addr: "127.0.0.1",
	MonPort: 3313, PortMin: 7200, PortMax: 7299},
	AtEnd: func(stop func()) { afterTests = append(afterTests, stop) }}

func testCeph(t *testing.T) *testceph.Cluster { t.Helper(); return cephLazy.Get(t) }

// onRealCeph needs the test API server and the CSI tests' Ceph, and returns
// a context that ends with the test or after d, that Ceph, and a CSI
// controller closed when the test ends.
func onRealCeph(t *testing.T, d time.Duration) (context.Context, *testceph.Cluster, *Controller) {
	t.Helper()
	ctx := apiCtx(t, d)
	c := testCeph(t)
	s := apiController(t, ControllerConfig{})
	t.Cleanup(s.Close)
	return ctx, c, s
}

// cephStorageCluster makes a ceph StorageCluster named name on c's pool,
// with its Secret, both gone when the test ends.
func cephStorageCluster(ctx context.Context, t *testing.T, c *testceph.Cluster, name, monitors string) *v1.StorageCluster {
	t.Helper()
	key, err := c.ClientKey()
	if err != nil {
		t.Fatal(err)
	}
	cephSecret(ctx, t, name, c.Client, key)
	sc := cephCluster(name, monitors, c.Pool)
	create(ctx, t, sc)
	return sc
}

func blockCap() *csi.VolumeCapability {
	return capability(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, true, "")
}

// export reads a volume's image (or image@snap) as the berth client.
func export(ctx context.Context, t *testing.T, c *testceph.Cluster, spec string) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out")
	if _, err := c.RBD(ctx, "export", "--no-progress", spec, out); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A ceph class's volumes are RBD images the controller makes itself: no
// node, reachable from all, every call answered from the pool, each
// repeated call the same answer, and nothing left after the deletes.
func TestCephVolumesOnRealCeph(t *testing.T) {
	ctx, c, s := onRealCeph(t, 5*time.Minute)
	cephStorageCluster(ctx, t, c, "ceph-csi", c.Monitors)
	params := map[string]string{v1.ParamStorageCluster: "ceph-csi"}
	image := func(id string) string { return c.Pool + "/berth-" + id }
	create := func(name string, size int64, src *csi.VolumeContentSource) (*csi.Volume, error) {
		resp, err := s.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, Parameters: params,
			CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{blockCap()},
			VolumeContentSource: src})
		return resp.GetVolume(), err
	}

	// Create, and the same request again.
	start := time.Now()
	vol, err := create("ceph-a", 8<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("CreateVolume took %s", time.Since(start).Round(time.Millisecond))
	if vol.GetCapacityBytes() != 8<<20 || len(vol.GetAccessibleTopology()) != 0 {
		t.Errorf("volume %v: want 8 MiB and no topology", vol)
	}
	again, err := create("ceph-a", 8<<20, nil)
	if err != nil || again.GetVolumeId() != vol.GetVolumeId() || again.GetCapacityBytes() != vol.GetCapacityBytes() {
		t.Errorf("same request again: %v, %v; want %v", again, err, vol)
	}
	if _, err := create("ceph-a", 16<<20, nil); status.Code(err) != codes.AlreadyExists {
		t.Errorf("same name, other size: %v, want AlreadyExists", err)
	}
	obj := &v1.Volume{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: vol.GetVolumeId()}, obj); err != nil {
		t.Fatal(err)
	}
	if obj.Spec.Node != "" || len(obj.Labels) != 0 || obj.Status.State != v1.VolumeAvailable || obj.Status.Capacity.Value() != 8<<20 {
		t.Errorf("Volume: node %q labels %v state %s capacity %v; want no node, Available, 8 MiB", obj.Spec.Node, obj.Labels, obj.Status.State, obj.Status.Capacity)
	}
	if _, err := c.RBD(ctx, "info", image(vol.GetVolumeId())); err != nil {
		t.Errorf("no RBD image: %v", err)
	}
	// Data to find in the copies.
	if _, err := c.RBD(ctx, "bench", "--io-type", "write", "--io-size", "64K", "--io-total", "8M", "--io-pattern", "rand", image(vol.GetVolumeId())); err != nil {
		t.Fatal(err)
	}
	data := export(ctx, t, c, image(vol.GetVolumeId()))

	// Expand.
	grown, err := s.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: vol.GetVolumeId(),
		CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20}, VolumeCapability: blockCap()})
	if err != nil || grown.GetCapacityBytes() != 16<<20 || grown.GetNodeExpansionRequired() {
		t.Errorf("expand: %v, %v; want 16 MiB, no node expansion for block", grown, err)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: vol.GetVolumeId()}, obj); err != nil || obj.Spec.Size.Value() != 16<<20 || obj.Status.Capacity.Value() != 16<<20 {
		t.Errorf("Volume after expand: size %v capacity %v, %v", obj.Spec.Size.String(), obj.Status.Capacity, err)
	}

	// Snapshot, and again.
	snap, err := s.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "ceph-a-snap", SourceVolumeId: vol.GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	if !snap.GetSnapshot().GetReadyToUse() || snap.GetSnapshot().GetSizeBytes() != 16<<20 {
		t.Errorf("snapshot %v: want ready, 16 MiB", snap.GetSnapshot())
	}
	snapAgain, err := s.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "ceph-a-snap", SourceVolumeId: vol.GetVolumeId()})
	if err != nil || snapAgain.GetSnapshot().GetSnapshotId() != snap.GetSnapshot().GetSnapshotId() ||
		!snapAgain.GetSnapshot().GetCreationTime().AsTime().Equal(snap.GetSnapshot().GetCreationTime().AsTime()) {
		t.Errorf("same snapshot again: %v, %v", snapAgain, err)
	}
	// A volume with snapshots stays.
	if _, err := s.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol.GetVolumeId()}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("delete a volume with snapshots: %v, want FailedPrecondition", err)
	}

	// Clones from the snapshot and from the volume hold its data.
	fromSnap, err := create("ceph-from-snap", 16<<20, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()}}})
	if err != nil {
		t.Fatal(err)
	}
	fromVol, err := create("ceph-from-vol", 32<<20, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
		Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: vol.GetVolumeId()}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		v    *csi.Volume
		size int64
	}{{fromSnap, 16 << 20}, {fromVol, 32 << 20}} {
		if tc.v.GetCapacityBytes() != tc.size || len(tc.v.GetAccessibleTopology()) != 0 {
			t.Errorf("clone %s: %d bytes, topology %v; want %d, none", tc.v.GetVolumeId(), tc.v.GetCapacityBytes(), tc.v.GetAccessibleTopology(), tc.size)
		}
		if got := export(ctx, t, c, image(tc.v.GetVolumeId())); !bytes.Equal(got[:len(data)], data) {
			t.Errorf("clone %s does not hold the source's data", tc.v.GetVolumeId())
		}
	}

	// Capacity from the pool.
	capResp, err := s.GetCapacity(ctx, &csi.GetCapacityRequest{Parameters: params,
		AccessibleTopology: &csi.Topology{Segments: map[string]string{v1.TopologyNodeKey: "any-node"}}})
	if err != nil || capResp.GetAvailableCapacity() <= 0 {
		t.Errorf("capacity: %v, %v; want > 0", capResp, err)
	}

	// Delete everything, twice each.
	for i := 0; i < 2; i++ {
		if _, err := s.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()}); err != nil {
			t.Errorf("delete snapshot (%d): %v", i, err)
		}
		for _, v := range []*csi.Volume{vol, fromSnap, fromVol} {
			if _, err := s.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
				t.Errorf("delete %s (%d): %v", v.GetVolumeId(), i, err)
			}
		}
	}
	for _, v := range []*csi.Volume{vol, fromSnap, fromVol} {
		if err := env.Client.Get(ctx, client.ObjectKey{Name: v.GetVolumeId()}, &v1.Volume{}); !apierrors.IsNotFound(err) {
			t.Errorf("Volume %s still there (%v)", v.GetVolumeId(), err)
		}
		if _, err := c.RBD(ctx, "info", image(v.GetVolumeId())); err == nil {
			t.Errorf("image of %s still there", v.GetVolumeId())
		}
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: snap.GetSnapshot().GetSnapshotId()}, &v1.Snapshot{}); !apierrors.IsNotFound(err) {
		t.Errorf("Snapshot still there (%v)", err)
	}
	out, err := c.RBD(ctx, "ls", c.Pool)
	if err != nil || strings.Contains(string(out), "berth-") {
		t.Errorf("images left in the pool: %q, %v", out, err)
	}
}

// Monitors that do not answer: CreateVolume says Unavailable and records
// nothing; a changed Secret (here: the cluster fixed) reconnects.
func TestCephUnreachableOnRealCeph(t *testing.T) {
	ctx, c, s := onRealCeph(t, 2*time.Minute)
	sc := cephStorageCluster(ctx, t, c, "ceph-csi-down", strings.Replace(c.Monitors, ":3313", ":1", 1))
	params := map[string]string{v1.ParamStorageCluster: sc.Name}
	req := &csi.CreateVolumeRequest{Name: "ceph-down", Parameters: params,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 4 << 20}, VolumeCapabilities: []*csi.VolumeCapability{blockCap()}}
	if _, err := s.CreateVolume(ctx, req); status.Code(err) != codes.Unavailable {
		t.Errorf("unreachable monitors: %v, want Unavailable", err)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "ceph-down"}, &v1.Volume{}); !apierrors.IsNotFound(err) {
		t.Errorf("a refused create left a Volume (%v)", err)
	}
	// The fixed cluster (a new generation) gets a new connection.
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(sc), sc); err != nil {
		t.Fatal(err)
	}
	sc.Spec.Ceph.Monitors = []v1.CephMonitor{v1.CephMonitor(c.Monitors)}
	if err := env.Client.Update(ctx, sc); err != nil {
		t.Fatal(err)
	}
	resp, err := s.CreateVolume(ctx, req)
	if err != nil {
		t.Fatalf("after the fix: %v", err)
	}
	if _, err := s.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: resp.GetVolume().GetVolumeId()}); err != nil {
		t.Error(err)
	}
}

// Ceph stalling mid-CreateVolume (every OSD stopped): the call ends at the
// caller's deadline as Unavailable (a code the external-provisioner
// retries, as the create may still be under way) naming Ceph, and records
// no Volume; once
// the OSDs run again, the retried call (as the external-provisioner
// retries) makes the volume, and no image of the abandoned one is left.
func TestCephStalledMidCreateOnRealCeph(t *testing.T) {
	ctx, c, s := onRealCeph(t, 3*time.Minute)
	sc := cephStorageCluster(ctx, t, c, "ceph-csi-stalled", c.Monitors)
	req := &csi.CreateVolumeRequest{Name: "ceph-stalled", Parameters: map[string]string{v1.ParamStorageCluster: sc.Name},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 4 << 20}, VolumeCapabilities: []*csi.VolumeCapability{blockCap()}}
	// Connected first, so that the stall hits the create, not the connect.
	if _, err := s.GetCapacity(ctx, &csi.GetCapacityRequest{Parameters: req.Parameters}); err != nil {
		t.Fatal(err)
	}
	thaw, err := c.FreezeOSDs()
	if err != nil {
		t.Fatal(err)
	}
	defer thaw()
	callCtx, callCancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = s.CreateVolume(callCtx, req)
	callCancel()
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "ceph") {
		t.Fatalf("create with the OSDs stopped: %v; want Unavailable naming ceph", err)
	}
	t.Logf("create with the OSDs stopped: %v", err)
	var rec v1.Volume
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "ceph-stalled"}, &rec); err == nil && rec.Status.State == v1.VolumeAvailable {
		t.Errorf("an abandoned create left an Available Volume: %+v", rec.Status)
	} else if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	thaw()
	resp, err := s.CreateVolume(ctx, req)
	if err != nil {
		t.Fatalf("retried create after the OSDs resumed: %v", err)
	}
	if _, err := s.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: resp.GetVolume().GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		out, err := c.RBD(ctx, "ls", c.Pool)
		if err == nil && !strings.Contains(string(out), "berth-") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("images left in the pool: %q, %v", out, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// An RWX volume of a ceph class (an RBD image its share manager serves)
// expands with the node step asked for (the share manager's node grows the
// device, the share manager the filesystem), is snapshotted and cloned,
// and RWX volumes restored from the snapshot or cloned from it hold its
// data; each copy is an RWX filesystem Volume with no node.
func TestCephRWXOnRealCeph(t *testing.T) {
	ctx, c, s := onRealCeph(t, 5*time.Minute)
	cephStorageCluster(ctx, t, c, "ceph-rwx", c.Monitors)
	params := map[string]string{v1.ParamStorageCluster: "ceph-rwx"}
	image := func(id string) string { return c.Pool + "/berth-" + id }
	var made []string
	create := func(name string, size int64, src *csi.VolumeContentSource) *csi.Volume {
		t.Helper()
		resp, err := s.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, Parameters: params,
			CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{rwxCap()},
			VolumeContentSource: src})
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		made = append(made, resp.GetVolume().GetVolumeId())
		obj := &v1.Volume{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: resp.GetVolume().GetVolumeId()}, obj); err != nil {
			t.Fatal(err)
		}
		if obj.Spec.AccessMode != v1.ReadWriteMany || obj.Spec.VolumeMode != v1.VolumeModeFilesystem || obj.Spec.Node != "" ||
			resp.GetVolume().GetCapacityBytes() != size {
			t.Errorf("%s: %s %s on %q, %d bytes; want ReadWriteMany Filesystem, no node, %d", name, obj.Spec.AccessMode,
				obj.Spec.VolumeMode, obj.Spec.Node, resp.GetVolume().GetCapacityBytes(), size)
		}
		return resp.GetVolume()
	}
	vol := create("ceph-rwx-src", 8<<20, nil)
	if _, err := c.RBD(ctx, "bench", "--io-type", "write", "--io-size", "64K", "--io-total", "8M", "--io-pattern", "rand", image(vol.GetVolumeId())); err != nil {
		t.Fatal(err)
	}
	data := export(ctx, t, c, image(vol.GetVolumeId()))

	grown, err := s.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: vol.GetVolumeId(),
		CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20}, VolumeCapability: rwxCap()})
	if err != nil || grown.GetCapacityBytes() != 16<<20 || !grown.GetNodeExpansionRequired() {
		t.Errorf("expand: %v, %v; want 16 MiB with the node step", grown, err)
	}
	obj := &v1.Volume{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: vol.GetVolumeId()}, obj); err != nil || obj.Status.Capacity.Value() != 16<<20 {
		t.Errorf("Volume capacity after expand %v, %v; want 16 MiB (what the share device grows to)", obj.Status.Capacity, err)
	}

	snap, err := s.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "ceph-rwx-snap", SourceVolumeId: vol.GetVolumeId()})
	if err != nil {
		t.Fatalf("snapshot of an RWX volume: %v", err)
	}
	if !snap.GetSnapshot().GetReadyToUse() || snap.GetSnapshot().GetSizeBytes() != 16<<20 {
		t.Errorf("snapshot %v: want ready, 16 MiB", snap.GetSnapshot())
	}
	fromSnap := create("ceph-rwx-restored", 24<<20, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()}}})
	fromVol := create("ceph-rwx-clone", 16<<20, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
		Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: vol.GetVolumeId()}}})
	for _, v := range []*csi.Volume{fromSnap, fromVol} {
		if got := export(ctx, t, c, image(v.GetVolumeId())); !bytes.Equal(got[:len(data)], data) {
			t.Errorf("%s does not hold the source's data", v.GetVolumeId())
		}
	}

	if _, err := s.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()}); err != nil {
		t.Errorf("delete snapshot: %v", err)
	}
	for _, id := range made {
		if _, err := s.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Errorf("delete %s: %v", id, err)
		}
	}
}
