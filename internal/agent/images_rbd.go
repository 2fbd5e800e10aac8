package agent

import (
	"context"
	"errors"
	"path/filepath"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend"
)

// volumeImages finds a volume's image in this node's local backends or,
// for a volume of a ceph StorageCluster, as its Volume records its RBD
// image (status.path POOL/IMAGE, status.capacity): the CSI controller makes
// and grows those, every node reaches them.
type volumeImages struct {
	local Images
	api   client.Reader
}

func (a *Agent) volumeImages() volumeImages { return volumeImages{local: a.images, api: a.api} }

// rbd returns the Volume of id when it is an RBD image (no node, a path
// that is no file).
func (v volumeImages) rbd(ctx context.Context, id string) (*v1.Volume, bool) {
	vol := &v1.Volume{}
	if err := v.api.Get(ctx, client.ObjectKey{Name: id}, vol); err != nil {
		return nil, false
	}
	return vol, vol.Spec.Node == "" && vol.Status.Path != "" && !filepath.IsAbs(vol.Status.Path)
}

func (v volumeImages) Get(ctx context.Context, id string) (backend.Image, error) {
	img, err := v.local.Get(ctx, id)
	if !errors.Is(err, backend.ErrNotFound) {
		return img, err
	}
	vol, ok := v.rbd(ctx, id)
	if !ok {
		return img, err
	}
	size := vol.Spec.Size.Value()
	if c := vol.Status.Capacity; c != nil {
		size = c.Value()
	}
	return backend.Image{ID: id, Path: vol.Status.Path, Size: size}, nil
}

// Format: an RBD image keeps no record of its own; its Volume's status
// (status.formatted) is the record.
func (v volumeImages) Format(ctx context.Context, id string) (backend.FormatRecord, bool, error) {
	rec, found, err := v.local.Format(ctx, id)
	if errors.Is(err, backend.ErrNotFound) {
		if _, ok := v.rbd(ctx, id); ok {
			return backend.FormatRecord{}, false, nil
		}
	}
	return rec, found, err
}

func (v volumeImages) RecordFormat(ctx context.Context, id, fsType string, at time.Time) error {
	err := v.local.RecordFormat(ctx, id, fsType, at)
	if errors.Is(err, backend.ErrNotFound) {
		if _, ok := v.rbd(ctx, id); ok {
			return nil
		}
	}
	return err
}
