package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// ClusterDetacher force-detaches a storage cluster's volumes from this node.
type ClusterDetacher interface {
	DetachCluster(ctx context.Context, cluster string) ([]string, error)
}

// ClusterCleanupReconciler runs in the agent: when a StorageCluster with
// cleanup policy Detach is being deleted, it removes every volume of that
// cluster from this node, even while pods use them, and reports the node in
// status.cleanedNodes; the operator lifts the finalizer once every node has.
type ClusterCleanupReconciler struct {
	Client   client.Client
	Node     string
	Detacher ClusterDetacher
	Recorder record.EventRecorder
	Log      logr.Logger
}

// +kubebuilder:rbac:groups=berth.io,resources=storageclusters,verbs=get;list;watch
// +kubebuilder:rbac:groups=berth.io,resources=storageclusters/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile implements reconcile.Reconciler.
func (r *ClusterCleanupReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	sc := &v1.StorageCluster{}
	if err := r.Client.Get(ctx, req.NamespacedName, sc); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if sc.DeletionTimestamp.IsZero() || sc.Spec.CleanupPolicy == v1.CleanupRetain || slices.Contains(sc.Status.CleanedNodes, r.Node) {
		return ctrl.Result{}, nil
	}
	detached, err := r.Detacher.DetachCluster(ctx, sc.Name)
	if err != nil {
		r.Recorder.Eventf(sc, corev1.EventTypeWarning, "CleanupFailed", "node %s: %v", r.Node, err)
		// The error requeues with backoff (a RequeueAfter beside it is ignored).
		return ctrl.Result{}, fmt.Errorf("detach cluster %s: %w", sc.Name, err)
	}
	if len(detached) > 0 {
		r.Recorder.Eventf(sc, corev1.EventTypeNormal, "VolumesDetached", "node %s force-detached %d volume(s) of the deleted cluster: %s",
			r.Node, len(detached), strings.Join(detached, ", "))
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := r.Client.Get(ctx, req.NamespacedName, sc); err != nil {
			return err
		}
		if slices.Contains(sc.Status.CleanedNodes, r.Node) {
			return nil
		}
		sc.Status.CleanedNodes = append(sc.Status.CleanedNodes, r.Node)
		return r.Client.Status().Update(ctx, sc)
	})
	if err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	r.Log.Info("node cleaned for deleted cluster", "cluster", sc.Name, "volumes", detached)
	return ctrl.Result{}, nil
}

// SetupWithManager registers the reconciler.
func (r *ClusterCleanupReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).For(&v1.StorageCluster{}).Named("clustercleanup").Complete(r)
}
