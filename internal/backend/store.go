package backend

import (
	"context"
)

// Store is what a volume backend offers the controller and the agent: the
// method set of *Local, which other backends (internal/backend/ceph)
// implement with the same Image/Snapshot types and sentinel errors.
type Store interface {
	Create(ctx context.Context, id string, size int64) (Image, error)
	CreateFromSnapshot(ctx context.Context, id, snapshotID string, size int64) (Image, error)
	CreateFromVolume(ctx context.Context, id, sourceID string, size int64) (Image, error)
	Get(ctx context.Context, id string) (Image, error)
	List(ctx context.Context) ([]Image, error)
	Delete(ctx context.Context, id string) error
	Expand(ctx context.Context, id string, size int64) (Image, error)
	Capacity(ctx context.Context) (int64, error)

	CreateSnapshot(ctx context.Context, snapID, sourceID string) (Snapshot, error)
	GetSnapshot(ctx context.Context, id string) (Snapshot, error)
	ListSnapshots(ctx context.Context) ([]Snapshot, error)
	DeleteSnapshot(ctx context.Context, id string) error
}

var _ Store = (*Local)(nil)
