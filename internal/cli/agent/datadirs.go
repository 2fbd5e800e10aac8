package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend"
)

// dataDirs is the repeatable --data-dir flag.
type dataDirs struct{ dirs *[]string }

func (d *dataDirs) String() string {
	if d.dirs == nil {
		return ""
	}
	return strings.Join(*d.dirs, ",")
}

func (d *dataDirs) Set(v string) error {
	if v == "" {
		return errors.New("empty data dir")
	}
	*d.dirs = append(*d.dirs, v)
	return nil
}

// clusterPlace returns where a StorageCluster keeps its images and how they
// are provisioned; backend.ErrNotFound when it has no object.
func clusterPlace(ctx context.Context, c client.Reader, cluster string) (backend.Place, error) {
	sc := &v1.StorageCluster{}
	err := c.Get(ctx, client.ObjectKey{Name: cluster}, sc)
	if apierrors.IsNotFound(err) {
		return backend.Place{}, fmt.Errorf("StorageCluster %s: %w", cluster, backend.ErrNotFound)
	}
	if err != nil {
		return backend.Place{}, fmt.Errorf("StorageCluster %s: %w", cluster, err)
	}
	p := backend.Place{Dir: sc.Spec.DataDir}
	if o := sc.Spec.Overcommit; o != nil {
		p.Provisioning.OvercommitPercent = o.Percent
	}
	return p, nil
}

// volumePlace returns, for a volume, where its StorageCluster (the Volume
// names it) keeps images.
func volumePlace(c client.Reader) func(ctx context.Context, volumeID string) (backend.Place, error) {
	return func(ctx context.Context, volumeID string) (backend.Place, error) {
		vol := &v1.Volume{}
		if err := c.Get(ctx, client.ObjectKey{Name: volumeID}, vol); err != nil {
			return backend.Place{}, fmt.Errorf("volume %s: %w", volumeID, err)
		}
		return clusterPlace(ctx, c, vol.Spec.StorageCluster)
	}
}

// clusterCapacity returns what new images of a StorageCluster's data dir
// may still promise.
func clusterCapacity(c client.Reader, images *backend.Set) func(ctx context.Context, cluster string) (int64, error) {
	return func(ctx context.Context, cluster string) (int64, error) {
		p, err := clusterPlace(ctx, c, cluster)
		if dirs := images.Dirs(); errors.Is(err, backend.ErrNotFound) && len(dirs) == 1 {
			// An agent run alone (tests): its one data dir, as for images.
			p, err = backend.Place{Dir: dirs[0]}, nil
		}
		if err != nil {
			return 0, fmt.Errorf("%w: %w", backend.ErrNoDataDir, err)
		}
		return images.Capacity(ctx, p.Dir, p.Provisioning)
	}
}
