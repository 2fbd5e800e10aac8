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

// clusterDir returns the data dir of a StorageCluster; backend.ErrNotFound
// when it has no object.
func clusterDir(ctx context.Context, c client.Reader, cluster string) (string, error) {
	sc := &v1.StorageCluster{}
	err := c.Get(ctx, client.ObjectKey{Name: cluster}, sc)
	if apierrors.IsNotFound(err) {
		return "", fmt.Errorf("StorageCluster %s: %w", cluster, backend.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("StorageCluster %s: %w", cluster, err)
	}
	return sc.Spec.DataDir, nil
}

// clusterDataDir returns, for a volume being created, the data dir of its
// StorageCluster (the Volume names it).
func clusterDataDir(c client.Reader) func(ctx context.Context, volumeID string) (string, error) {
	return func(ctx context.Context, volumeID string) (string, error) {
		vol := &v1.Volume{}
		if err := c.Get(ctx, client.ObjectKey{Name: volumeID}, vol); err != nil {
			return "", fmt.Errorf("volume %s: %w", volumeID, err)
		}
		return clusterDir(ctx, c, vol.Spec.StorageCluster)
	}
}

// clusterCapacity returns the free bytes of a StorageCluster's data dir.
func clusterCapacity(c client.Reader, images *backend.Set) func(ctx context.Context, cluster string) (int64, error) {
	return func(ctx context.Context, cluster string) (int64, error) {
		dir, err := clusterDir(ctx, c, cluster)
		if dirs := images.Dirs(); errors.Is(err, backend.ErrNotFound) && len(dirs) == 1 {
			// An agent run alone (tests): its one data dir, as for images.
			dir, err = dirs[0], nil
		}
		if err != nil {
			return 0, fmt.Errorf("%w: %w", backend.ErrNoDataDir, err)
		}
		return images.Capacity(ctx, dir)
	}
}
