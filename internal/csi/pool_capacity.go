package csi

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend/ceph"
	"github.com/berth-io/berth/internal/capacity"
	"github.com/berth-io/berth/internal/metrics"
)

// PoolCapacityLabel marks the CSIStorageCapacity objects of ceph pools, apart
// from the agents' per-node ones: the publisher lists and prunes only its own.
// (Not the class name as value: a class name may be longer than a label.)
const PoolCapacityLabel = "berth.io/pool-capacity"

// PoolCapacityPublisher publishes one CSIStorageCapacity per StorageClass of
// a ceph StorageCluster, with the pool's free bytes and a topology that
// matches every node (each node reaches the pool). Without it the scheduler
// finds no capacity for a WaitForFirstConsumer ceph class and places no pod.
type PoolCapacityPublisher struct {
	Client    client.Client
	Namespace string
	// Usage returns the free and used bytes of a ceph StorageCluster's pool.
	Usage func(ctx context.Context, sc *v1.StorageCluster) (ceph.PoolUsage, error)
	// Metrics gets each pool read (nil: none).
	Metrics *metrics.Pools
	// Schedule: every minute by default, and when a berth class is added
	// or changed.
	capacity.Schedule
	Log logr.Logger
}

// +kubebuilder:rbac:groups=storage.k8s.io,resources=storageclasses,verbs=get;list;watch
// +kubebuilder:rbac:groups=storage.k8s.io,namespace=berth-system,resources=csistoragecapacities,verbs=get;list;create;update;delete

// Start publishes now, then on the Schedule, until ctx ends.
func (p *PoolCapacityPublisher) Start(ctx context.Context) error {
	return p.Schedule.Run(ctx, time.Minute, p.Log, func(ctx context.Context) (bool, error) {
		return false, p.Publish(ctx)
	})
}

// Publish writes the capacity of every ceph class once and removes those of
// classes gone or no longer ceph. A pool that cannot be read keeps its last
// capacity: an outage of Ceph is no reason to tell the scheduler it is full.
func (p *PoolCapacityPublisher) Publish(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.RoundTimeout())
	defer cancel()
	var classes storagev1.StorageClassList
	if err := p.Client.List(ctx, &classes); err != nil {
		return fmt.Errorf("list storage classes: %w", err)
	}
	var errs []error
	keep := map[string]bool{}
	// One read per cluster: its classes share the pool.
	free := map[string]int64{}
	unread, clusters := map[string]bool{}, map[string]bool{}
	for i := range classes.Items {
		cls := &classes.Items[i]
		name := cls.Parameters[v1.ParamStorageCluster]
		if cls.Provisioner != v1.DriverName || name == "" {
			continue
		}
		var sc v1.StorageCluster
		if err := p.Client.Get(ctx, client.ObjectKey{Name: name}, &sc); err != nil {
			if !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("get StorageCluster %s: %w", name, err))
				keep[cls.Name] = true // unknown yet: leave what is published
			}
			continue
		}
		if sc.Spec.Backend != v1.BackendCeph {
			continue
		}
		keep[cls.Name], clusters[name] = true, true
		n, ok := free[name]
		if unread[name] {
			continue
		}
		if !ok {
			u, err := p.Usage(ctx, &sc)
			if err != nil {
				p.Log.Error(err, "read pool free bytes; keeping the last published capacity", "storageCluster", name)
				unread[name] = true
				continue
			}
			n, free[name] = u.Free, u.Free
			p.Metrics.Set(name, u.Free, u.Used)
		}
		if err := capacity.Publish(ctx, p.Client, p.Namespace, PoolCapacityName(cls.Name),
			map[string]string{PoolCapacityLabel: "true"}, &metav1.LabelSelector{}, cls, n); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		// Only after a full look: a cluster not read now may still be one.
		p.Metrics.Keep(clusters)
	}
	errs = append(errs, p.prune(ctx, keep))
	return errors.Join(errs...)
}

// prune deletes the pool capacities of classes not in keep (the owner
// reference removes those of deleted classes too, but only once the garbage
// collector runs, and not those of a class whose cluster left ceph).
func (p *PoolCapacityPublisher) prune(ctx context.Context, keep map[string]bool) error {
	var caps storagev1.CSIStorageCapacityList
	if err := p.Client.List(ctx, &caps, client.InNamespace(p.Namespace), client.HasLabels{PoolCapacityLabel}); err != nil {
		return fmt.Errorf("list pool capacities: %w", err)
	}
	var errs []error
	for i := range caps.Items {
		c := &caps.Items[i]
		if keep[c.StorageClassName] {
			continue
		}
		if err := p.Client.Delete(ctx, c); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete csistoragecapacity %s: %w", c.Name, err))
		}
	}
	return errors.Join(errs...)
}

// PoolCapacityName is the name of a class's pool capacity: a hash, as a
// class name may be as long as a name can be.
func PoolCapacityName(class string) string {
	return capacity.Name("berth-pool-capacity-", class)
}
