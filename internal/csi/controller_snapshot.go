package csi

import (
	"context"
	"sort"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// resolveSource fills the spec of a volume made from a snapshot or a clone:
// the copy lives on the source's node and is at least as large as the source.
func (s *Controller) resolveSource(ctx context.Context, src *csi.VolumeContentSource, spec *v1.VolumeSpec, size *int64, r *csi.CapacityRange) error {
	if src == nil {
		return nil
	}
	var srcSize int64
	switch {
	case src.GetSnapshot() != nil:
		snap, err := s.getSnapshot(ctx, src.GetSnapshot().GetSnapshotId())
		if err != nil {
			return err
		}
		if !snap.Status.ReadyToUse || snap.Status.Size == nil {
			return status.Errorf(codes.Unavailable, "snapshot %s is not ready yet", snap.Name)
		}
		if err := s.checkSnapshotMode(ctx, snap, spec.VolumeMode); err != nil {
			return err
		}
		src := &v1.Volume{}
		if err := s.c.Get(ctx, client.ObjectKey{Name: snap.Spec.SourceVolume}, src); err == nil && src.Spec.StorageCluster != spec.StorageCluster {
			return status.Errorf(codes.InvalidArgument, "snapshot %s is of a volume of StorageCluster %s, the new one belongs to %s", snap.Name, src.Spec.StorageCluster, spec.StorageCluster)
		}
		spec.Source = &v1.VolumeSource{Snapshot: snap.Name}
		spec.Node = snap.Spec.Node
		srcSize = snap.Status.Size.Value()
	case src.GetVolume() != nil:
		vol, err := s.getVolume(ctx, src.GetVolume().GetVolumeId())
		if err != nil {
			return err
		}
		if vol.Spec.VolumeMode != spec.VolumeMode {
			return status.Errorf(codes.InvalidArgument, "source volume %s is %s, the new one %s", vol.Name, vol.Spec.VolumeMode, spec.VolumeMode)
		}
		if vol.Spec.StorageCluster != spec.StorageCluster {
			return status.Errorf(codes.InvalidArgument, "source volume %s belongs to StorageCluster %s, the new one to %s", vol.Name, vol.Spec.StorageCluster, spec.StorageCluster)
		}
		spec.Source = &v1.VolumeSource{Volume: vol.Name}
		spec.Node = vol.Spec.Node
		srcSize = vol.Spec.Size.Value()
	default:
		return status.Error(codes.InvalidArgument, "content source names neither a snapshot nor a volume")
	}
	if *size < srcSize {
		if r.GetRequiredBytes() > 0 {
			return status.Errorf(codes.OutOfRange, "requested %d bytes, smaller than the source's %d", r.GetRequiredBytes(), srcSize)
		}
		*size = srcSize
	}
	if r.GetLimitBytes() > 0 && *size > r.GetLimitBytes() {
		return status.Errorf(codes.OutOfRange, "source has %d bytes, more than the limit %d", srcSize, r.GetLimitBytes())
	}
	return nil
}

// checkSnapshotMode refuses to restore a snapshot into a volume of another
// mode (a block image read as a filesystem, or the reverse), as clones are.
// A snapshot taken before berth recorded the mode is checked against its
// source volume, while that exists. Once that is gone too, the mode is
// unknown and it restores only as a block volume (F22): as a filesystem the
// privileged agent would run blkid, e2fsck and a kernel mount on bytes a
// tenant may have written to a raw device; a block restore hands them back
// untouched.
func (s *Controller) checkSnapshotMode(ctx context.Context, snap *v1.Snapshot, want v1.VolumeMode) error {
	mode := snap.Spec.VolumeMode
	if mode == "" {
		src := &v1.Volume{}
		err := s.c.Get(ctx, client.ObjectKey{Name: snap.Spec.SourceVolume}, src)
		switch {
		case apierrors.IsNotFound(err):
			if want == v1.VolumeModeBlock {
				return nil
			}
			return status.Errorf(codes.InvalidArgument,
				"snapshot %s was taken before berth recorded volume modes and its source volume %s is gone: its mode is unknown, so it restores only as a Block volume (volumeMode: Block); check its contents from there",
				snap.Name, snap.Spec.SourceVolume)
		case err != nil:
			return status.Errorf(codes.Unavailable, "get Volume %s: %v", snap.Spec.SourceVolume, err)
		}
		mode = src.Spec.VolumeMode
	}
	if mode != want {
		return status.Errorf(codes.InvalidArgument, "snapshot %s is of a %s volume, the new one is %s", snap.Name, mode, want)
	}
	return nil
}

// CreateSnapshot implements csi.ControllerServer.
func (s *Controller) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name missing")
	}
	if req.GetSourceVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "source volume ID missing")
	}
	name := objectName("snap", req.GetName())
	snap := &v1.Snapshot{}
	err := s.c.Get(ctx, client.ObjectKey{Name: name}, snap)
	switch {
	case apierrors.IsNotFound(err):
		vol, err := s.getVolume(ctx, req.GetSourceVolumeId())
		if err != nil {
			return nil, err
		}
		if inCeph(vol.Spec.Node) {
			return s.createCephSnapshot(ctx, req, vol, nil)
		}
		snap = &v1.Snapshot{
			ObjectMeta: metav1.ObjectMeta{
				Name:        name,
				Labels:      map[string]string{v1.NodeLabel: vol.Spec.Node},
				Annotations: map[string]string{v1.CSINameAnnotation: req.GetName()},
			},
			Spec: v1.SnapshotSpec{SourceVolume: vol.Name, Node: vol.Spec.Node, VolumeMode: vol.Spec.VolumeMode},
		}
		if err := s.c.Create(ctx, snap); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, status.Errorf(codes.Internal, "create Snapshot %s: %v", name, err)
		}
	case err != nil:
		return nil, status.Errorf(codes.Unavailable, "get Snapshot %s: %v", name, err)
	case !snap.DeletionTimestamp.IsZero():
		// What a failed attempt left is still being removed.
		return nil, status.Errorf(codes.Aborted, "snapshot %q is being removed after a failed attempt; retry", req.GetName())
	case snap.Spec.SourceVolume != req.GetSourceVolumeId():
		return nil, status.Errorf(codes.AlreadyExists, "snapshot %q exists for volume %s", req.GetName(), snap.Spec.SourceVolume)
	case inCeph(snap.Spec.Node) && !snap.Status.ReadyToUse:
		vol, err := s.getVolume(ctx, snap.Spec.SourceVolume)
		if err != nil {
			return nil, err
		}
		return s.createCephSnapshot(ctx, req, vol, snap)
	}

	snap, err = s.waitSnapshot(ctx, name, func(snap *v1.Snapshot) bool {
		return snap.Status.ReadyToUse || snap.Status.Message != ""
	})
	if err != nil {
		return nil, err
	}
	if !snap.Status.ReadyToUse {
		return nil, s.failedSnapshot(ctx, snap)
	}
	return &csi.CreateSnapshotResponse{Snapshot: csiSnapshot(snap)}, nil
}

// failedSnapshot removes a Snapshot the agent could not take, so a refused
// request leaves nothing behind, and names the agent's reason.
func (s *Controller) failedSnapshot(ctx context.Context, snap *v1.Snapshot) error {
	return s.removeFailed(ctx, snap, snap.Status.Conditions, "node %s could not take snapshot %s: %s", snap.Spec.Node, snap.Name, snap.Status.Message)
}

// DeleteSnapshot implements csi.ControllerServer.
func (s *Controller) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	snap := &v1.Snapshot{}
	err := s.deleteObject(ctx, "Snapshot", req.GetSnapshotId(), snap, func() string { return snap.Spec.Node },
		func(ctx context.Context) error { return s.deleteCephSnapshot(ctx, snap) })
	return answer(&csi.DeleteSnapshotResponse{}, err)
}

// ListSnapshots implements csi.ControllerServer.
func (s *Controller) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	var items []v1.Snapshot
	if id := req.GetSnapshotId(); id != "" {
		snap, err := s.getSnapshot(ctx, id)
		if status.Code(err) == codes.NotFound {
			return &csi.ListSnapshotsResponse{}, nil
		}
		if err != nil {
			return nil, err
		}
		items = []v1.Snapshot{*snap}
	} else {
		list := &v1.SnapshotList{}
		if err := s.c.List(ctx, list); err != nil {
			return nil, status.Errorf(codes.Unavailable, "list snapshots: %v", err)
		}
		items = list.Items
	}
	var out []v1.Snapshot
	for _, sn := range items {
		if src := req.GetSourceVolumeId(); src != "" && sn.Spec.SourceVolume != src {
			continue
		}
		if sn.DeletionTimestamp != nil {
			continue
		}
		out = append(out, sn)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	start, end, next, err := page(len(out), req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	resp := &csi.ListSnapshotsResponse{NextToken: next}
	for i := start; i < end; i++ {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: csiSnapshot(&out[i])})
	}
	return resp, nil
}

func (s *Controller) getSnapshot(ctx context.Context, id string) (*v1.Snapshot, error) {
	return getObject(ctx, s, "Snapshot", id, &v1.Snapshot{})
}

func csiSnapshot(s *v1.Snapshot) *csi.Snapshot {
	out := &csi.Snapshot{SnapshotId: s.Name, SourceVolumeId: s.Spec.SourceVolume, ReadyToUse: s.Status.ReadyToUse}
	if s.Status.Size != nil {
		out.SizeBytes = s.Status.Size.Value()
	}
	created := s.CreationTimestamp.Time
	if s.Status.CreatedAt != nil {
		created = s.Status.CreatedAt.Time
	}
	out.CreationTime = timestamppb.New(created)
	return out
}
