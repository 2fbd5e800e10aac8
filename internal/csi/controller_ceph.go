package csi

import (
	"context"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/backend/ceph"
)

// A volume or snapshot of a ceph StorageCluster has no node: the controller
// makes its RBD image itself, and no agent looks at it (agents watch their
// node's objects only). v1.ImageFinalizer keeps the object until the
// controller removed the image.

// annotationCephCluster on a ceph Snapshot names its StorageCluster, so
// that it can be deleted without its source volume.
const annotationCephCluster = "berth.io/storage-cluster"

func inCeph(nodeName string) bool { return nodeName == "" }

// busyIDs refuses a second call on an ID while one runs (the Store wants
// per-ID serialisation); the caller retries on Aborted, as CSI intends.
type busyIDs struct {
	mu   sync.Mutex
	busy map[string]bool
}

func (b *busyIDs) lock(id string) (func(), error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.busy[id] {
		return nil, status.Errorf(codes.Aborted, "an operation on %s is in progress", id)
	}
	if b.busy == nil {
		b.busy = map[string]bool{}
	}
	b.busy[id] = true
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		delete(b.busy, id)
	}, nil
}

// cephStoreOf returns the connection to the named cluster's Ceph.
func (s *Controller) cephStoreOf(ctx context.Context, cluster string) (ceph.Store, func(), error) {
	sc := &v1.StorageCluster{}
	if err := s.c.Get(ctx, client.ObjectKey{Name: cluster}, sc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil, status.Errorf(codes.FailedPrecondition, "StorageCluster %s does not exist: its Ceph is unknown", cluster)
		}
		return nil, nil, status.Errorf(codes.Unavailable, "get StorageCluster %s: %v", cluster, err)
	}
	return s.ceph.get(ctx, s.c, sc)
}

// cephCall holds id for one call and connects to cluster's Ceph; done
// lets go of both.
func (s *Controller) cephCall(ctx context.Context, id, cluster string) (ceph.Store, func(), error) {
	unlock, err := s.busy.lock(id)
	if err != nil {
		return nil, nil, err
	}
	store, release, err := s.cephStoreOf(ctx, cluster)
	if err != nil {
		unlock()
		return nil, nil, err
	}
	return store, func() { release(); unlock() }, nil
}

// createCephVolume makes the RBD image of a new volume, recorded first as
// a Volume without node so that a failed or repeated call finds it.
func (s *Controller) createCephVolume(ctx context.Context, req *csi.CreateVolumeRequest, spec v1.VolumeSpec, size int64) (*csi.CreateVolumeResponse, error) {
	name := objectName("vol", req.GetName())
	unlock, err := s.busy.lock(name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	spec.Node = ""
	vol := &v1.Volume{}
	err = s.c.Get(ctx, client.ObjectKey{Name: name}, vol)
	found := err == nil
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, status.Errorf(codes.Unavailable, "get Volume %s: %v", name, err)
	case !vol.DeletionTimestamp.IsZero():
		return nil, status.Errorf(codes.Aborted, "volume %q is being deleted; retry", req.GetName())
	default:
		if err := sameVolume(vol, &spec); err != nil {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q exists with other parameters: %v", req.GetName(), err)
		}
		if vol.Status.State == v1.VolumeAvailable {
			return &csi.CreateVolumeResponse{Volume: csiVolume(vol, req.GetVolumeContentSource())}, nil
		}
	}
	// Connect before recording anything: a Ceph that cannot be reached
	// leaves nothing behind.
	store, release, err := s.cephStoreOf(ctx, spec.StorageCluster)
	if err != nil {
		return nil, err
	}
	defer release()
	if !found {
		vol = &v1.Volume{ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{v1.CSINameAnnotation: req.GetName()},
			Finalizers:  []string{v1.ImageFinalizer},
		}, Spec: spec}
		if err := s.c.Create(ctx, vol); err != nil {
			return nil, status.Errorf(codes.Internal, "create Volume %s: %v", name, err)
		}
	}
	var img backend.Image
	switch src := spec.Source; {
	case src == nil:
		img, err = store.Create(ctx, name, size)
	case src.Snapshot != "":
		img, err = store.CreateFromSnapshot(ctx, name, src.Snapshot, size)
	default:
		img, err = store.CreateFromVolume(ctx, name, src.Volume, size)
	}
	if err != nil {
		return nil, s.dropCephVolume(ctx, vol, store, cephStatus("create RBD image of volume "+name, err, ""))
	}
	vol.Status.State = v1.VolumeAvailable
	vol.Status.Capacity = resource.NewQuantity(img.Size, resource.BinarySI)
	vol.Status.Path = img.Path
	vol.Status.Message = ""
	vol.Status.ObservedGeneration = vol.Generation
	if err := s.c.Status().Update(ctx, vol); err != nil {
		return nil, status.Errorf(codes.Aborted, "record volume %s ready, retry: %v", name, err)
	}
	s.log.Info("made ceph volume", "volume", name, "size", img.Size, "path", img.Path)
	return &csi.CreateVolumeResponse{Volume: csiVolume(vol, req.GetVolumeContentSource())}, nil
}

// dropCephVolume removes the Volume of a create that failed for good (the
// Store undoes a failed create; Delete here removes any leftover). A
// failure that may pass (Ceph unreachable, a deadline) keeps it for the
// retry, which finishes it, or for DeleteVolume, which collects it.
func (s *Controller) dropCephVolume(ctx context.Context, vol *v1.Volume, store ceph.Store, cause error) error {
	switch status.Code(cause) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.Canceled:
		return cause
	}
	if err := store.Delete(ctx, vol.Name); err != nil {
		s.log.Error(err, "remove what a failed ceph create made; the Volume stays for DeleteVolume", "volume", vol.Name)
		return cause
	}
	if err := s.forget(ctx, vol); err != nil {
		s.log.Error(err, "remove the Volume of a failed ceph create", "volume", vol.Name)
	}
	return cause
}

// forget removes obj, whose image is gone: its finalizer, then itself.
func (s *Controller) forget(ctx context.Context, obj client.Object) error {
	if controllerutil.RemoveFinalizer(obj, v1.ImageFinalizer) {
		if err := s.c.Update(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	if err := s.c.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// deleteCephVolume removes the image, then the Volume.
func (s *Controller) deleteCephVolume(ctx context.Context, vol *v1.Volume) error {
	store, done, err := s.cephCall(ctx, vol.Name, vol.Spec.StorageCluster)
	if err != nil {
		return err
	}
	defer done()
	if err := store.Delete(ctx, vol.Name); err != nil {
		return cephStatus("delete RBD image of volume "+vol.Name, err, "")
	}
	if err := s.forget(ctx, vol); err != nil {
		return status.Errorf(codes.Internal, "remove Volume %s: %v", vol.Name, err)
	}
	s.log.Info("deleted ceph volume", "volume", vol.Name)
	return nil
}

// expandCephVolume grows the image; the node grows the filesystem.
func (s *Controller) expandCephVolume(ctx context.Context, vol *v1.Volume, size int64) (*csi.ControllerExpandVolumeResponse, error) {
	store, done, err := s.cephCall(ctx, vol.Name, vol.Spec.StorageCluster)
	if err != nil {
		return nil, err
	}
	defer done()
	size = max(size, vol.Spec.Size.Value())
	img, err := store.Expand(ctx, vol.Name, size)
	if err != nil {
		return nil, cephStatus("grow RBD image of volume "+vol.Name, err, "")
	}
	if err := s.growSpec(ctx, vol, size); err != nil {
		return nil, err
	}
	if err := s.updateVolume(ctx, vol, func() error {
		vol.Status.Capacity = resource.NewQuantity(img.Size, resource.BinarySI)
		vol.Status.ObservedGeneration = vol.Generation
		return s.c.Status().Update(ctx, vol)
	}); err != nil {
		return nil, status.Errorf(codes.Aborted, "record Volume %s's capacity, retry: %v", vol.Name, err)
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: img.Size, NodeExpansionRequired: vol.Spec.VolumeMode != v1.VolumeModeBlock}, nil
}

// createCephSnapshot takes an RBD snapshot of vol; snap is the Snapshot a
// previous call recorded (not ready yet), nil on the first.
func (s *Controller) createCephSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest, vol *v1.Volume, snap *v1.Snapshot) (*csi.CreateSnapshotResponse, error) {
	name := objectName("snap", req.GetName())
	// Connect before recording anything, as for volumes.
	store, done, err := s.cephCall(ctx, name, vol.Spec.StorageCluster)
	if err != nil {
		return nil, err
	}
	defer done()
	if snap == nil {
		snap = &v1.Snapshot{
			ObjectMeta: metav1.ObjectMeta{
				Name: name,
				Annotations: map[string]string{
					v1.CSINameAnnotation:  req.GetName(),
					annotationCephCluster: vol.Spec.StorageCluster,
				},
				Finalizers: []string{v1.ImageFinalizer},
			},
			Spec: v1.SnapshotSpec{SourceVolume: vol.Name, VolumeMode: vol.Spec.VolumeMode},
		}
		if err := s.c.Create(ctx, snap); err != nil {
			return nil, status.Errorf(codes.Internal, "create Snapshot %s: %v", name, err)
		}
	}
	taken, err := store.CreateSnapshot(ctx, name, vol.Name)
	if err != nil {
		cause := cephStatus("take RBD snapshot "+name, err, "")
		switch status.Code(cause) {
		case codes.Unavailable, codes.DeadlineExceeded:
		default:
			if derr := store.DeleteSnapshot(ctx, name); derr == nil {
				if ferr := s.forget(ctx, snap); ferr != nil {
					s.log.Error(ferr, "remove the Snapshot of a failed ceph snapshot", "snapshot", name)
				}
			}
		}
		return nil, cause
	}
	snap.Status.ReadyToUse = true
	snap.Status.Size = resource.NewQuantity(taken.Size, resource.BinarySI)
	snap.Status.CreatedAt = &metav1.Time{Time: taken.CreatedAt}
	snap.Status.Message = ""
	if err := s.c.Status().Update(ctx, snap); err != nil {
		return nil, status.Errorf(codes.Aborted, "record snapshot %s ready, retry: %v", name, err)
	}
	return &csi.CreateSnapshotResponse{Snapshot: csiSnapshot(snap)}, nil
}

// deleteCephSnapshot removes the RBD snapshot, then the Snapshot.
func (s *Controller) deleteCephSnapshot(ctx context.Context, snap *v1.Snapshot) error {
	cluster := snap.Annotations[annotationCephCluster]
	if cluster == "" {
		return status.Errorf(codes.Internal, "ceph snapshot %s lacks annotation %s", snap.Name, annotationCephCluster)
	}
	store, done, err := s.cephCall(ctx, snap.Name, cluster)
	if err != nil {
		return err
	}
	defer done()
	if err := store.DeleteSnapshot(ctx, snap.Name); err != nil {
		return cephStatus("delete RBD snapshot "+snap.Name, err, "")
	}
	if err := s.forget(ctx, snap); err != nil {
		return status.Errorf(codes.Internal, "remove Snapshot %s: %v", snap.Name, err)
	}
	return nil
}

// cephCapacity is what the cluster's pool can still take; every node
// reaches it, so the topology asked does not matter.
func (s *Controller) cephCapacity(ctx context.Context, sc *v1.StorageCluster) (*csi.GetCapacityResponse, error) {
	store, release, err := s.ceph.get(ctx, s.c, sc)
	if err != nil {
		return nil, err
	}
	defer release()
	free, err := store.Capacity(ctx)
	if err != nil {
		return nil, cephStatus("capacity of StorageCluster "+sc.Name, err, "")
	}
	return &csi.GetCapacityResponse{AvailableCapacity: free}, nil
}

// PoolUsage is the free and used bytes of a ceph StorageCluster's pool, for
// the PoolCapacityPublisher: the same read as GetCapacity's, without gRPC
// codes.
func (s *Controller) PoolUsage(ctx context.Context, sc *v1.StorageCluster) (ceph.PoolUsage, error) {
	store, release, err := s.ceph.get(ctx, s.c, sc)
	if err != nil {
		return ceph.PoolUsage{}, err
	}
	defer release()
	return store.PoolUsage(ctx)
}

// Close closes the controller's Ceph connections, at shutdown.
func (s *Controller) Close() { s.ceph.close() }
