package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/backend/ceph"
	"github.com/berth-io/berth/internal/volerr"
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

// formatRecords are where a stage of vol reads and writes its format
// record: for a volume of a ceph StorageCluster its RBD image's metadata,
// through a connection made with the stage's cephx client (close ends it);
// else the local image's xattr. A ceph volume whose record cannot be
// reached gets an error: never "no record", which would let a stage that
// finds no filesystem make one over data.
func (a *Agent) formatRecords(ctx context.Context, vol *v1.Volume, sc *v1.StorageCluster, secrets map[string]string) (recs FormatRecords, close func(), err error) {
	if sc == nil || sc.Spec.Backend != v1.BackendCeph {
		return a.images, func() {}, nil
	}
	if sc.Spec.Ceph == nil {
		return nil, nil, fmt.Errorf("volume %s: its ceph StorageCluster %s names no monitors and pool: %w", vol.Name, sc.Name, volerr.ErrPrecondition)
	}
	// The image the CSI controller made: POOL/berth-ID, as ceph.Backend
	// names it; the record is looked up by that name.
	pool, image, _ := strings.Cut(vol.Status.Path, "/")
	if pool == "" || image != ceph.ImageName(vol.Name) {
		return nil, nil, fmt.Errorf("volume %s: RBD image %q is not POOL/%s, where its format record would be: %w",
			vol.Name, vol.Status.Path, ceph.ImageName(vol.Name), volerr.ErrPrecondition)
	}
	cfg, err := ceph.ConfigFor(ctx, sc.Spec.Ceph, secrets[secretUserID], secrets[secretUserKey], nil)
	if err != nil {
		return nil, nil, fmt.Errorf("volume %s: monitors of StorageCluster %s: %w", vol.Name, sc.Name, err)
	}
	cfg.Pool = pool
	cfg.Enter = a.netns.enter(vol.Name, sc)
	open := a.openRecords
	if open == nil {
		open = ceph.OpenRecords
	}
	r, err := open(ctx, cfg, a.log.WithName("format-record"))
	if err != nil {
		return nil, nil, fmt.Errorf("volume %s: connect to ceph for its format record, which says whether it holds a filesystem: %w",
			vol.Name, cephCause(err))
	}
	return r, r.Close, nil
}

// cephCause gives a failed connection its kind, as serverCause does a
// server's: a refused key is the caller's to fix, unreachable monitors may
// come back.
func cephCause(err error) error {
	switch {
	case errors.Is(err, ceph.ErrAuthentication), errors.Is(err, ceph.ErrNotBuilt):
		return fmt.Errorf("%w: %w", err, volerr.ErrPrecondition)
	case errors.Is(err, ceph.ErrMonitorsUnreachable), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %w", err, volerr.ErrUnavailable)
	}
	return err
}
