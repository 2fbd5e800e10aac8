package agent

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
	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/capacity"
)

// CapacityReporter publishes the backend's free bytes as one
// CSIStorageCapacity per berth StorageClass for this node, in berth's
// namespace (none for a class of a ceph StorageCluster: the CSI controller
// publishes its pool's, csi.PoolCapacityPublisher): the scheduler reads them
// (CSIDriver storageCapacity) to place pods with WaitForFirstConsumer volumes, and the CSI controller to place new
// volumes and answer GetCapacity. The agent writes no Node: the admission
// policy lets it write only the capacities of its own node.
type CapacityReporter struct {
	// Client reads the API server directly: a cache would watch every
	// CSIStorageCapacity of the cluster.
	Client    client.Client
	Node      string
	Namespace string
	// Free returns the free bytes of a StorageCluster's data dir on this
	// node; backend.ErrNoDataDir: this agent does not serve that cluster.
	Free func(ctx context.Context, cluster string) (int64, error)
	// Schedule: every 30s by default, and when a berth class is added or
	// changed.
	capacity.Schedule
	Log logr.Logger
}

// +kubebuilder:rbac:groups=storage.k8s.io,resources=storageclasses,verbs=get;list;watch
// +kubebuilder:rbac:groups=berth.io,resources=storageclusters,verbs=get
// +kubebuilder:rbac:groups=storage.k8s.io,namespace=berth-system,resources=csistoragecapacities,verbs=get;create;update

// Start reports now and then on the Schedule until ctx ends
// (manager.Runnable). A round that published nothing runs again soon: no
// class yet (the operator makes them beside this agent) or no StorageCluster
// yet; one that failed (the API server), within 10s (capacity.Schedule).
// The scheduler places no volume on this node until a capacity is published.
func (r *CapacityReporter) Start(ctx context.Context) error {
	return r.Schedule.Run(ctx, 30*time.Second, r.Log, func(ctx context.Context) (bool, error) {
		n, err := r.report(ctx)
		return n == 0, err
	})
}

// Report publishes the free bytes once, for every berth StorageClass.
func (r *CapacityReporter) Report(ctx context.Context) error {
	_, err := r.report(ctx)
	return err
}

// report returns how many capacities it published.
func (r *CapacityReporter) report(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, r.RoundTimeout())
	defer cancel()
	var classes storagev1.StorageClassList
	if err := r.Client.List(ctx, &classes); err != nil {
		return 0, fmt.Errorf("list storage classes: %w", err)
	}
	var errs []error
	published := 0
	for i := range classes.Items {
		if cls := &classes.Items[i]; cls.Provisioner == v1.DriverName {
			// A class names its StorageCluster; each keeps its images in its
			// own data dir, so each class has its own free bytes.
			cluster := cls.Parameters[v1.ParamStorageCluster]
			if cluster == "" {
				continue
			}
			pool, err := r.pooled(ctx, cluster)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if pool {
				// The pool's free bytes are the CSI controller's to publish,
				// not this node's: a node-local capacity would let the
				// scheduler place ceph volumes by a disk they never use.
				continue
			}
			free, err := r.Free(ctx, cluster)
			if errors.Is(err, backend.ErrNoDataDir) {
				r.Log.V(1).Info("no capacity for a class whose cluster this agent does not serve", "class", cls.Name, "storageCluster", cluster, "reason", err.Error())
				continue
			}
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if err := r.publish(ctx, cls, free); err != nil {
				errs = append(errs, err)
			} else {
				published++
			}
		}
	}
	return published, errors.Join(errs...)
}

// pooled tells whether a StorageCluster keeps its volumes in a Ceph pool. A
// cluster with no object yet is not: Free decides for it as before.
func (r *CapacityReporter) pooled(ctx context.Context, cluster string) (bool, error) {
	var sc v1.StorageCluster
	err := r.Client.Get(ctx, client.ObjectKey{Name: cluster}, &sc)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get StorageCluster %s: %w", cluster, err)
	}
	return sc.Spec.Backend == v1.BackendCeph, nil
}

// publish writes the class's capacity object of this node, creating it.
func (r *CapacityReporter) publish(ctx context.Context, cls *storagev1.StorageClass, free int64) error {
	return capacity.Publish(ctx, r.Client, r.Namespace, CapacityName(r.Node, cls.Name),
		map[string]string{v1.NodeLabel: r.Node, CapacityClassLabel: cls.Name},
		&metav1.LabelSelector{MatchLabels: map[string]string{v1.TopologyNodeKey: r.Node}}, cls, free)
}

// CapacityClassLabel on a CSIStorageCapacity names its StorageClass (with
// v1.NodeLabel naming the node), so one node's capacities are listed by label.
const CapacityClassLabel = "berth.io/storage-class"

// CapacityName is the name of the CSIStorageCapacity of a node and class: a
// hash of both (any join of the two names could collide, and both may be
// long); the labels and fields say which node and class it is.
func CapacityName(node, class string) string {
	return capacity.Name("berth-capacity-", node+"/"+class)
}
