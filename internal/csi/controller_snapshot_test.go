package csi

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/testenv"
)

var (
	env *testenv.Env
	// suite: the API server tests also mount (root).
	suite = &testenv.Suite{Root: true, Setup: func(e *testenv.Env) error { env = e; return nil },
		Teardown: func(bool) error {
			for _, f := range afterTests {
				f()
			}
			return nil
		}}
	// afterTests run once every test is done (a test Ceph to stop).
	afterTests []func()
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, suite)) }

// TestCreateSnapshotFailureLeavesNothing: on a node whose disk is too full
// for the copy, CreateSnapshot answers ResourceExhausted and removes its
// Snapshot object; a snapshot that fits is taken, and the same request again
// returns the same snapshot.
func TestCreateSnapshotFailureLeavesNothing(t *testing.T) {
	ctx := apiCtx(t, 2*time.Minute)
	const node = "snap-node"
	// A small tmpfs is a disk that fills for real.
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=24m"); err != nil {
		t.Skipf("mount a 24 MiB tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	images, err := backend.NewLocal(dir, testr.New(t))
	if err != nil {
		t.Skipf("local backend on tmpfs: %v", err)
	}
	runNodeReconcilers(t, node, images)

	full := nodeVolume(ctx, t, node, "snap-full", "16Mi")
	// Fill the image for real: a copy now needs 16 MiB, the disk has ~8.
	if err := os.WriteFile(full, make16MiB(), 0o600); err != nil {
		t.Fatal(err)
	}
	nodeVolume(ctx, t, node, "snap-small", "4Mi")

	s := apiController(t, ControllerConfig{Wait: 30 * time.Second})
	_, err = s.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-of-full", SourceVolumeId: "snap-full"})
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("snapshot that does not fit: %v, want ResourceExhausted", err)
	}
	name := objectName("snap", "snap-of-full")
	waitGone(ctx, t, &v1.Snapshot{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if _, err := os.Stat(filepath.Join(dir, "snapshots", name+".img")); err == nil {
		t.Error("the failed snapshot left its image")
	}

	first, err := s.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-of-small", SourceVolumeId: "snap-small"})
	if err != nil {
		t.Fatalf("snapshot that fits: %v", err)
	}
	again, err := s.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-of-small", SourceVolumeId: "snap-small"})
	if err != nil {
		t.Fatalf("same snapshot again: %v", err)
	}
	if a, b := first.GetSnapshot(), again.GetSnapshot(); a.GetSnapshotId() != b.GetSnapshotId() || !a.GetCreationTime().AsTime().Equal(b.GetCreationTime().AsTime()) || !b.GetReadyToUse() {
		t.Errorf("retry returned another snapshot: %v, first %v", b, a)
	}
	if _, err := s.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: first.GetSnapshot().GetSnapshotId()}); err != nil {
		t.Errorf("delete snapshot: %v", err)
	}
}

func make16MiB() []byte {
	b := make([]byte, 16<<20)
	for i := range b {
		b[i] = byte(i%251) + 1
	}
	return b
}

// nodeVolume makes a Volume on node, waits for its image and returns its
// path; the Volume goes when the test ends.
func nodeVolume(ctx context.Context, t *testing.T, node, name, size string) string {
	t.Helper()
	vol := &v1.Volume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1.NodeLabel: node}},
		Spec: v1.VolumeSpec{StorageCluster: "c", Size: resource.MustParse(size), AccessMode: v1.ReadWriteOnce,
			FSType: "ext4", Node: node},
	}
	if err := env.Client.Create(ctx, vol); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), vol)
		waitGone(context.Background(), t, vol)
	})
	for range 300 {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(vol), vol); err == nil && vol.Status.State == v1.VolumeAvailable {
			return vol.Status.Path
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("volume %s not made: %+v", name, vol.Status)
	return ""
}

func waitGone(ctx context.Context, t *testing.T, obj client.Object) {
	t.Helper()
	for range 100 {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); apierrors.IsNotFound(err) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("%s is still there", obj.GetName())
}

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

	s := apiController(t, ControllerConfig{Wait: 2 * time.Second})
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
		refusedMadeNothing(ctx, t, "restore-of-"+snap)
	}

	// An old snapshot whose source is gone (F22): its mode is unknown. As a
	// filesystem it would put a tenant's raw bytes through blkid, e2fsck and
	// a kernel mount in the agent: refused. As a block volume it is
	// accepted (the restore then waits for a node agent, absent here).
	readySnapshot(ctx, t, "restore-snap-orphan", "restore-src-gone", "")
	orphan := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "restore-snap-orphan"}}}
	_, err := s.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: "restore-of-orphan-fs", VolumeCapabilities: []*csi.VolumeCapability{fsCap},
		Parameters: map[string]string{v1.ParamStorageCluster: "c"}, VolumeContentSource: orphan,
	})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "restores only as a Block volume") {
		t.Errorf("filesystem volume from a snapshot of unknown mode: %v, want InvalidArgument naming Block", err)
	}
	refusedMadeNothing(ctx, t, "restore-of-orphan-fs")
	blockCap := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	_, err = s.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: "restore-of-orphan-block", VolumeCapabilities: []*csi.VolumeCapability{blockCap},
		Parameters: map[string]string{v1.ParamStorageCluster: "c"}, VolumeContentSource: orphan,
	})
	if status.Code(err) == codes.InvalidArgument {
		t.Errorf("block volume from a snapshot of unknown mode: %v, want it accepted", err)
	}
	made := &v1.Volume{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: objectName("vol", "restore-of-orphan-block")}, made); err == nil {
		_ = env.Client.Delete(context.Background(), made)
	}
}

// refusedMadeNothing checks that a refused CreateVolume of name made no Volume.
func refusedMadeNothing(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	made := &v1.Volume{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: objectName("vol", name)}, made); err == nil {
		t.Errorf("a refused restore made Volume %s", made.Name)
		_ = env.Client.Delete(context.Background(), made)
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
