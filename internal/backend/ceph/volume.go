//go:build ceph

package ceph

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"

	"github.com/ceph/go-ceph/rbd"

	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/volerr"
)

const (
	snapshotSource = "snapshot:"
	volumeSource   = "volume:"
)

// Create makes an empty image of at least size bytes (rounded up to 4 KiB).
// The same id and size again returns the existing image.
func (b *Backend) Create(ctx context.Context, id string, size int64) (backend.Image, error) {
	return b.create(ctx, id, size, "", 0, func(name string, size int64) error {
		return b.newImage(name, size)
	})
}

// CreateFromSnapshot clones a snapshot into a new volume grown to size. The
// clone is flattened, so the volume and the snapshot can be deleted in any
// order (as with backend.Local), at the cost of copying the data.
func (b *Backend) CreateFromSnapshot(ctx context.Context, id, snapshotID string, size int64) (backend.Image, error) {
	var snap backend.Snapshot
	err := do(ctx, "", func() error {
		var err error
		snap, err = b.getSnapshot(snapshotID)
		return err
	})
	if err != nil {
		return backend.Image{}, fmt.Errorf("create volume %s: source %s%s: %w", id, snapshotSource, snapshotID, err)
	}
	parent := ImageName(snap.SourceID)
	return b.create(ctx, id, size, snapshotSource+snapshotID, snap.Size, func(name string, size int64) error {
		return b.clone(ctx, parent, snapName(snapshotID), name, size)
	})
}

// CreateFromVolume clones a volume into a new one grown to size, through a
// temporary snapshot of the source (point in time, unlike a copy of an image
// in use) that is removed once the clone is flattened.
func (b *Backend) CreateFromVolume(ctx context.Context, id, sourceID string, size int64) (backend.Image, error) {
	src, err := b.Get(ctx, sourceID)
	if err != nil {
		return backend.Image{}, fmt.Errorf("create volume %s: source %s%s: %w", id, volumeSource, sourceID, err)
	}
	parent, tmp := ImageName(sourceID), tmpSnapPrefix+id
	return b.create(ctx, id, size, volumeSource+sourceID, src.Size, func(name string, size int64) (err error) {
		img, err := rbd.OpenImage(b.ioctx, parent, rbd.NoSnapshot)
		if err != nil {
			return fmt.Errorf("open source %s: %w", parent, err)
		}
		defer func() { _ = img.Close() }()
		// A failed attempt's temporary snapshot goes first.
		if err := removeSnap(img, tmp); err != nil {
			return err
		}
		if err := makeSnap(img, tmp); err != nil {
			return err
		}
		defer func() {
			if rerr := removeSnap(img, tmp); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}()
		return b.clone(ctx, parent, tmp, name, size)
	})
}

// create is the common part of the creates: build (which makes the image
// name and may leave it half-made on error) runs only when id has no record
// yet; on any failure, the image is removed again; the record written last
// makes the volume exist.
func (b *Backend) create(ctx context.Context, id string, size int64, source string, srcSize int64,
	build func(name string, size int64) error) (backend.Image, error) {
	if err := backend.ValidateID(id); err != nil {
		return backend.Image{}, err
	}
	size, err := alignSize(size)
	if err != nil {
		return backend.Image{}, err
	}
	if size < srcSize {
		return backend.Image{}, fmt.Errorf("size %d smaller than source %s (%d): %w", size, source, srcSize, volerr.ErrInvalid)
	}
	name := ImageName(id)
	var img backend.Image
	err = do(ctx, "", func() error {
		rec, ok, err := b.readRecord(volumesOmap, id)
		if err != nil {
			return err
		}
		if ok {
			img, err = b.getImage(id, rec)
			if err != nil {
				return err
			}
			if img.Size != size {
				return fmt.Errorf("%s has size %d, asked %d: %w", img.Path, img.Size, size, backend.ErrExists)
			}
			if rec.Source != source {
				return fmt.Errorf("%s has source %q, asked %q: %w", img.Path, rec.Source, source, backend.ErrExists)
			}
			return nil
		}
		// An image without a record is a failed create's leftover.
		if err := b.removeImage(name); err != nil {
			return fmt.Errorf("remove leftover of an unfinished create: %w", err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := build(name, size); err != nil {
			return b.undo(name, err)
		}
		if err := ctx.Err(); err != nil {
			return b.undo(name, err)
		}
		if err := b.writeRecord(volumesOmap, id, record{Image: name, Source: source}); err != nil {
			return b.undo(name, err)
		}
		img = backend.Image{ID: id, Path: b.spec(name), Size: size}
		b.log.Info("created volume", "id", id, "image", name, "size", size, "source", source)
		return nil
	})
	if err != nil {
		return backend.Image{}, fmt.Errorf("create volume %s: %w", id, err)
	}
	return img, nil
}

// undo removes a half-made image; if that fails too, it says so: the next
// create or delete of the same ID removes it.
func (b *Backend) undo(name string, cause error) error {
	if err := b.removeImage(name); err != nil {
		b.log.Error(err, "could not remove a half-made image; the next create or delete of its volume removes it", "image", name)
		return fmt.Errorf("%w (half-made image %s left: %w)", cause, b.spec(name), err)
	}
	return cause
}

func (b *Backend) imageOptions() (*rbd.ImageOptions, error) {
	opts := rbd.NewRbdImageOptions()
	if err := opts.SetUint64(rbd.ImageOptionFeatures, b.features); err != nil {
		opts.Destroy()
		return nil, err
	}
	if b.cfg.DataPool != "" {
		if err := opts.SetString(rbd.ImageOptionDataPool, b.cfg.DataPool); err != nil {
			opts.Destroy()
			return nil, err
		}
	}
	return opts, nil
}

func (b *Backend) newImage(name string, size int64) error {
	opts, err := b.imageOptions()
	if err != nil {
		return err
	}
	defer opts.Destroy()
	if err := rbd.CreateImage(b.ioctx, name, uint64(size), opts); err != nil {
		return fmt.Errorf("create image %s: %w", b.spec(name), err)
	}
	return nil
}

// clone makes name a flattened copy of parent@snap of size bytes.
func (b *Backend) clone(ctx context.Context, parent, snap, name string, size int64) error {
	opts, err := b.imageOptions()
	if err != nil {
		return err
	}
	defer opts.Destroy()
	// Clone v1 needs a protected parent snapshot (ours are, see makeSnap).
	if err := rbd.CloneImage(b.ioctx, parent, snap, b.ioctx, name, opts); err != nil {
		return fmt.Errorf("clone %s@%s to %s: %w", parent, snap, name, err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	img, err := rbd.OpenImage(b.ioctx, name, rbd.NoSnapshot)
	if err != nil {
		return fmt.Errorf("open clone %s: %w", name, err)
	}
	defer func() { _ = img.Close() }()
	if err := img.Resize(uint64(size)); err != nil {
		return fmt.Errorf("size clone %s: %w", name, err)
	}
	if err := img.Flatten(); err != nil {
		return fmt.Errorf("flatten clone %s: %w", name, err)
	}
	return nil
}

// removeImage removes an image; a missing one is not an error.
func (b *Backend) removeImage(name string) error {
	err := rbd.RemoveImage(b.ioctx, name)
	switch {
	case err == nil, isNotFound(err):
		return nil
	case errno(err) == syscall.ENOTEMPTY:
		return fmt.Errorf("remove image %s: %w: %w", b.spec(name), ErrHasSnapshots, err)
	case errno(err) == syscall.EBUSY:
		return fmt.Errorf("remove image %s: still open or mapped by a client: %w", b.spec(name), err)
	}
	return fmt.Errorf("remove image %s: %w", b.spec(name), err)
}

// Get returns a volume's image; Path is POOL/IMAGE.
func (b *Backend) Get(ctx context.Context, id string) (backend.Image, error) {
	return getRecord(ctx, "volume", id, b.getVolume)
}

// getVolume reads a volume's record and its image; ErrNotFound when either
// is missing.
func (b *Backend) getVolume(id string) (backend.Image, error) {
	rec, ok, err := b.readRecord(volumesOmap, id)
	if err != nil {
		return backend.Image{}, err
	}
	if !ok {
		return backend.Image{}, fmt.Errorf("volume %s: %w", id, backend.ErrNotFound)
	}
	return b.getImage(id, rec)
}

func (b *Backend) getImage(id string, rec record) (backend.Image, error) {
	img, err := rbd.OpenImageReadOnly(b.ioctx, rec.Image, rbd.NoSnapshot)
	if isNotFound(err) {
		return backend.Image{}, fmt.Errorf("volume %s (image %s): %w", id, b.spec(rec.Image), backend.ErrNotFound)
	}
	if err != nil {
		return backend.Image{}, fmt.Errorf("open %s: %w", b.spec(rec.Image), err)
	}
	defer func() { _ = img.Close() }()
	size, err := img.GetSize()
	if err != nil {
		return backend.Image{}, fmt.Errorf("size of %s: %w", b.spec(rec.Image), err)
	}
	return backend.Image{ID: id, Path: b.spec(rec.Image), Size: int64(size)}, nil
}

// List returns all volumes, in ID order.
func (b *Backend) List(ctx context.Context) ([]backend.Image, error) {
	return listRecords(ctx, b, "volumes", volumesOmap, b.getVolume)
}

// Delete removes a volume; a missing one is not an error. A volume with
// snapshots is refused (ErrHasSnapshots).
func (b *Backend) Delete(ctx context.Context, id string) error {
	if err := backend.ValidateID(id); err != nil {
		return err
	}
	err := do(ctx, "", func() error {
		// The image goes first: a record without an image reads as not
		// found, and a retry removes the record.
		if err := b.removeImage(ImageName(id)); err != nil {
			return err
		}
		return b.removeRecord(volumesOmap, id)
	})
	if err != nil {
		return fmt.Errorf("delete volume %s: %w", id, err)
	}
	b.log.Info("deleted volume", "id", id)
	return nil
}

// Expand grows a volume to at least size. Asking the current size again is
// a no-op; asking less is ErrInvalid.
func (b *Backend) Expand(ctx context.Context, id string, size int64) (backend.Image, error) {
	img, err := b.Get(ctx, id)
	if err != nil {
		return backend.Image{}, err
	}
	size, err = alignSize(size)
	if err != nil {
		return backend.Image{}, err
	}
	switch {
	case size == img.Size:
		return img, nil
	case size < img.Size:
		return backend.Image{}, fmt.Errorf("shrink %s from %d to %d: %w", id, img.Size, size, volerr.ErrInvalid)
	}
	name := strings.TrimPrefix(img.Path, b.cfg.Pool+"/")
	err = do(ctx, "", func() error {
		rimg, err := rbd.OpenImage(b.ioctx, name, rbd.NoSnapshot)
		if err != nil {
			return fmt.Errorf("open %s: %w", img.Path, err)
		}
		defer func() { _ = rimg.Close() }()
		return rimg.Resize(uint64(size))
	})
	if err != nil {
		return backend.Image{}, fmt.Errorf("expand volume %s: %w", id, err)
	}
	b.log.Info("expanded volume", "id", id, "from", img.Size, "to", size)
	img.Size = size
	return img, nil
}
