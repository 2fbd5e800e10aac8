//go:build ceph

package ceph

import (
	"context"
	"fmt"
	"time"

	"github.com/ceph/go-ceph/rbd"

	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/volerr"
)

// metaFormatted is the RBD image metadata key of an image's format record
// (backend.FormatRecord, as JSON): kept in the image's header, it lives and
// dies with the image, where a Volume's status or a node's file would not.
// librbd copies an image's metadata into its clones, so a volume made from
// a snapshot or another volume carries its source's record (which stage
// never formats anyway). Read it with
// `rbd image-meta get POOL/berth-ID berth.formatted`.
const metaFormatted = "berth.formatted"

// Format returns the format record of volume id's image; found is false
// for an image that has none. Every failure to read it (an image that
// cannot be opened, a monitor or OSD that does not answer before ctx ends
// or rados_osd_op_timeout) is an error, never "not found": stage would
// take that for a blank volume.
func (b *Backend) Format(ctx context.Context, id string) (rec backend.FormatRecord, found bool, err error) {
	name := ImageName(id)
	err = do(ctx, "", func() error {
		img, err := b.openImage(name, true)
		if err != nil {
			return err
		}
		defer func() { _ = img.Close() }()
		v, err := img.GetMetadata(metaFormatted)
		if isNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		found = true
		rec, _ = backend.DecodeFormatRecord([]byte(v))
		return nil
	})
	if err != nil {
		return backend.FormatRecord{}, false, fmt.Errorf("read format record of %s: %w", b.spec(name), err)
	}
	return rec, found, nil
}

// RecordFormat marks volume id's image as holding a filesystem of fsType.
// An existing record is kept: the first time is the one that counts.
// librbd commits metadata to the image header before it returns; an image
// whose exclusive lock another client holds (the node's blockdev server or
// krbd) has the write done through that lock owner.
func (b *Backend) RecordFormat(ctx context.Context, id, fsType string, at time.Time) error {
	name := ImageName(id)
	if fsType == "" {
		return fmt.Errorf("record format of %s: fs type missing: %w", id, volerr.ErrInvalid)
	}
	v, err := backend.FormatRecord{FSType: fsType, Time: at}.Encode()
	if err != nil {
		return err
	}
	var made bool
	err = do(ctx, "", func() error {
		img, err := b.openImage(name, false)
		if err != nil {
			return err
		}
		defer func() { _ = img.Close() }()
		if _, err := img.GetMetadata(metaFormatted); err == nil || !isNotFound(err) {
			return err
		}
		made = true
		return img.SetMetadata(metaFormatted, string(v))
	})
	if err != nil {
		return fmt.Errorf("record format on %s: %w", b.spec(name), err)
	}
	if made {
		b.log.Info("recorded format", "id", id, "image", name, "fsType", fsType)
	}
	return nil
}

// openImage opens name (readOnly: no watch, no lock); one that does not
// exist is backend.ErrNotFound.
func (b *Backend) openImage(name string, readOnly bool) (*rbd.Image, error) {
	open := rbd.OpenImage
	if readOnly {
		open = rbd.OpenImageReadOnly
	}
	img, err := open(b.ioctx, name, rbd.NoSnapshot)
	if isNotFound(err) {
		return nil, fmt.Errorf("image %s: %w", b.spec(name), backend.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("open image %s: %w", b.spec(name), err)
	}
	return img, nil
}
