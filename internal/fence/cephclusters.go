package fence

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend/ceph"
)

// CephClusters is the operator's Blocklister: it reaches each ceph
// StorageCluster as its Secret's client, connecting per call (fencing is
// rare; a connection kept open would need watching for key changes).
// Taking clients off the blocklist needs that client to have the mon cap
// `allow command "osd blocklist"` (`profile rbd` may only add).
type CephClusters struct {
	// C reads StorageClusters, Volumes and Secrets from the API server.
	C client.Client
	// Open connects (nil: ceph.OpenFencing; without the ceph build tag it
	// refuses with ceph.ErrNotBuilt).
	Open func(ctx context.Context, cfg ceph.Config, log logr.Logger) (ceph.Fencing, error)
	// LookupHost resolves monitor host names (nil: the system resolver).
	LookupHost func(ctx context.Context, host string) ([]string, error)
	// Namespace is berth's: the only one whose Secrets it reads.
	Namespace string
	Log       logr.Logger
}

var _ Blocklister = (*CephClusters)(nil)

// For is a BlocklisterFor: cc for a volume of a ceph StorageCluster, nil
// for any other. A volume whose objects cannot be read is an error, never
// "not ceph": that would break its holds without fencing them.
func (cc *CephClusters) For(ctx context.Context, volume string) (Blocklister, error) {
	var vol v1.Volume
	if err := cc.C.Get(ctx, client.ObjectKey{Name: volume}, &vol); err != nil {
		return nil, fmt.Errorf("volume %s: %w", volume, err)
	}
	var sc v1.StorageCluster
	if err := cc.C.Get(ctx, client.ObjectKey{Name: vol.Spec.StorageCluster}, &sc); err != nil {
		return nil, fmt.Errorf("storagecluster %s of volume %s: %w", vol.Spec.StorageCluster, volume, err)
	}
	if sc.Spec.Backend != v1.BackendCeph {
		return nil, nil
	}
	return cc, nil
}

// FenceClients fences addrs on the Ceph cluster of volume's StorageCluster.
func (cc *CephClusters) FenceClients(ctx context.Context, volume string, addrs []string) error {
	var vol v1.Volume
	if err := cc.C.Get(ctx, client.ObjectKey{Name: volume}, &vol); err != nil {
		return fmt.Errorf("volume %s: %w", volume, err)
	}
	var sc v1.StorageCluster
	if err := cc.C.Get(ctx, client.ObjectKey{Name: vol.Spec.StorageCluster}, &sc); err != nil {
		return fmt.Errorf("storagecluster %s of volume %s: %w", vol.Spec.StorageCluster, volume, err)
	}
	f, err := cc.connect(ctx, &sc)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.FenceClients(ctx, volume, addrs)
}

// UnfenceClients takes addrs off the blocklist of every ceph
// StorageCluster's Ceph (the record names no cluster; taking off an
// address that is not listed is no error).
func (cc *CephClusters) UnfenceClients(ctx context.Context, addrs []string) error {
	var list v1.StorageClusterList
	if err := cc.C.List(ctx, &list); err != nil {
		return fmt.Errorf("list storageclusters: %w", err)
	}
	for i := range list.Items {
		sc := &list.Items[i]
		if sc.Spec.Backend != v1.BackendCeph {
			continue
		}
		f, err := cc.connect(ctx, sc)
		if err != nil {
			return err
		}
		err = f.UnfenceClients(ctx, addrs)
		f.Close()
		if err != nil {
			return fmt.Errorf("storagecluster %s: %w", sc.Name, err)
		}
	}
	return nil
}

// connect opens sc's Ceph as its Secret's client.
func (cc *CephClusters) connect(ctx context.Context, sc *v1.StorageCluster) (ceph.Fencing, error) {
	if sc.Spec.Backend != v1.BackendCeph || sc.Spec.Ceph == nil {
		return nil, fmt.Errorf("storagecluster %s has no ceph backend", sc.Name)
	}
	secret, err := ceph.ReadSecret(ctx, cc.C, sc.Spec.Ceph.SecretRef, cc.Namespace)
	if err != nil {
		return nil, fmt.Errorf("storagecluster %s: %w", sc.Name, err)
	}
	cfg, err := ceph.ConfigFor(ctx, sc.Spec.Ceph, secret.UserID, secret.UserKey, cc.LookupHost)
	if err != nil {
		return nil, fmt.Errorf("storagecluster %s: %w", sc.Name, err)
	}
	open := cc.Open
	if open == nil {
		open = ceph.OpenFencing
	}
	f, err := open(ctx, cfg, cc.Log.WithValues("storageCluster", sc.Name))
	if err != nil {
		return nil, fmt.Errorf("storagecluster %s: %w", sc.Name, err)
	}
	return f, nil
}
