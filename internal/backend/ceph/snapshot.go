//go:build ceph

package ceph

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/ceph/go-ceph/rbd"

	"github.com/berth-io/berth/internal/backend"
)

func snapName(id string) string { return snapPrefix + id }

// CreateSnapshot makes an RBD snapshot of the source volume's image,
// protected so that volumes can be cloned from it. The same snapID and
// source again returns the existing one; another source is ErrExists.
func (b *Backend) CreateSnapshot(ctx context.Context, snapID, sourceID string) (backend.Snapshot, error) {
	if err := backend.ValidateID(snapID); err != nil {
		return backend.Snapshot{}, err
	}
	if err := backend.ValidateID(sourceID); err != nil {
		return backend.Snapshot{}, err
	}
	var snap backend.Snapshot
	err := do(ctx, "", func() error {
		rec, ok, err := b.readRecord(snapsOmap, snapID)
		if err != nil {
			return err
		}
		if ok {
			if rec.Source != sourceID {
				return fmt.Errorf("snapshot %s is of %q, asked %q: %w", snapID, rec.Source, sourceID, backend.ErrExists)
			}
			snap, err = b.snapshotOf(snapID, rec)
			return err
		}
		vrec, ok, err := b.readRecord(volumesOmap, sourceID)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("snapshot source: volume %s: %w", sourceID, backend.ErrNotFound)
		}
		img, err := rbd.OpenImage(b.ioctx, vrec.Image, rbd.NoSnapshot)
		if isNotFound(err) {
			return fmt.Errorf("snapshot source: volume %s: %w", sourceID, backend.ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("open %s: %w", b.spec(vrec.Image), err)
		}
		defer func() { _ = img.Close() }()
		name := snapName(snapID)
		// A snapshot without a record is a failed attempt's: it is older
		// than asked, so it is made again.
		if err := removeSnap(img, name); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := makeSnap(img, name); err != nil {
			return b.undoSnap(img, name, err)
		}
		rec = record{Image: vrec.Image, Snap: name, Source: sourceID}
		if err := ctx.Err(); err != nil {
			return b.undoSnap(img, name, err)
		}
		if err := b.writeRecord(snapsOmap, snapID, rec); err != nil {
			return b.undoSnap(img, name, err)
		}
		snap, err = b.snapshotOf(snapID, rec)
		return err
	})
	if err != nil {
		return backend.Snapshot{}, fmt.Errorf("create snapshot %s: %w", snapID, err)
	}
	b.log.Info("created snapshot", "id", snapID, "source", sourceID)
	return snap, nil
}

func (b *Backend) undoSnap(img *rbd.Image, name string, cause error) error {
	if err := removeSnap(img, name); err != nil {
		b.log.Error(err, "could not remove a half-made snapshot; the next create of it removes it", "image", img.GetName(), "snapshot", name)
		return fmt.Errorf("%w (half-made snapshot %s@%s left: %w)", cause, img.GetName(), name, err)
	}
	return cause
}

// makeSnap makes a protected snapshot (clone v1 needs the protection; v2
// would need every client to be mimic or newer).
func makeSnap(img *rbd.Image, name string) error {
	s, err := img.CreateSnapshot(name)
	if err != nil {
		return fmt.Errorf("snapshot %s@%s: %w", img.GetName(), name, err)
	}
	if err := s.Protect(); err != nil {
		_ = s.Remove()
		return fmt.Errorf("protect %s@%s: %w", img.GetName(), name, err)
	}
	return nil
}

// removeSnap unprotects and removes a snapshot; a missing one is not an
// error.
func removeSnap(img *rbd.Image, name string) error {
	s := img.GetSnapshot(name)
	protected, err := s.IsProtected()
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("snapshot %s@%s: %w", img.GetName(), name, err)
	}
	if protected {
		if err := s.Unprotect(); err != nil {
			if errno(err) == syscall.EBUSY {
				return fmt.Errorf("unprotect %s@%s: a clone of it is still being made: %w", img.GetName(), name, err)
			}
			return fmt.Errorf("unprotect %s@%s: %w", img.GetName(), name, err)
		}
	}
	if err := s.Remove(); err != nil && !isNotFound(err) {
		return fmt.Errorf("remove snapshot %s@%s: %w", img.GetName(), name, err)
	}
	return nil
}

// GetSnapshot returns a snapshot; ErrNotFound when missing. Path is
// POOL/IMAGE@SNAP.
func (b *Backend) GetSnapshot(ctx context.Context, id string) (backend.Snapshot, error) {
	return getRecord(ctx, "snapshot", id, b.getSnapshot)
}

func (b *Backend) getSnapshot(id string) (backend.Snapshot, error) {
	if err := backend.ValidateID(id); err != nil {
		return backend.Snapshot{}, err
	}
	rec, ok, err := b.readRecord(snapsOmap, id)
	if err != nil {
		return backend.Snapshot{}, err
	}
	if !ok {
		return backend.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, backend.ErrNotFound)
	}
	return b.snapshotOf(id, rec)
}

func (b *Backend) snapshotOf(id string, rec record) (backend.Snapshot, error) {
	path := b.spec(rec.Image) + "@" + rec.Snap
	img, err := rbd.OpenImageReadOnly(b.ioctx, rec.Image, rec.Snap)
	if isNotFound(err) {
		return backend.Snapshot{}, fmt.Errorf("snapshot %s (%s): %w", id, path, backend.ErrNotFound)
	}
	if err != nil {
		return backend.Snapshot{}, fmt.Errorf("open %s: %w", path, err)
	}
	defer func() { _ = img.Close() }()
	size, err := img.GetSize()
	if err != nil {
		return backend.Snapshot{}, fmt.Errorf("size of %s: %w", path, err)
	}
	snapID, err := img.GetSnapID(rec.Snap)
	if err != nil {
		return backend.Snapshot{}, fmt.Errorf("id of %s: %w", path, err)
	}
	ts, err := img.GetSnapTimestamp(snapID)
	if err != nil {
		return backend.Snapshot{}, fmt.Errorf("time of %s: %w", path, err)
	}
	return backend.Snapshot{
		ID:        id,
		SourceID:  rec.Source,
		Path:      path,
		Size:      int64(size),
		CreatedAt: time.Unix(ts.Sec, ts.Nsec),
	}, nil
}

// ListSnapshots returns all snapshots, in ID order.
func (b *Backend) ListSnapshots(ctx context.Context) ([]backend.Snapshot, error) {
	return listRecords(ctx, b, "snapshots", snapsOmap, b.getSnapshot)
}

// DeleteSnapshot removes a snapshot; a missing one is not an error.
func (b *Backend) DeleteSnapshot(ctx context.Context, id string) error {
	if err := backend.ValidateID(id); err != nil {
		return err
	}
	err := do(ctx, "", func() error {
		rec, ok, err := b.readRecord(snapsOmap, id)
		if err != nil || !ok {
			return err
		}
		img, err := rbd.OpenImage(b.ioctx, rec.Image, rbd.NoSnapshot)
		if err != nil && !isNotFound(err) {
			return fmt.Errorf("open %s: %w", b.spec(rec.Image), err)
		}
		if err == nil {
			err = removeSnap(img, rec.Snap)
			_ = img.Close()
			if err != nil {
				return err
			}
		}
		return b.removeRecord(snapsOmap, id)
	})
	if err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	b.log.Info("deleted snapshot", "id", id)
	return nil
}
