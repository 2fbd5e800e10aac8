// Package takeover is the operator's lock breaker: agents may not remove
// another node's holds on a volume (a compromised agent could claim a live
// node is lost, F4); they add a take-over request to the Attachment, and
// this controller checks the lock-breaking rules against the Node and Pod
// objects and breaks the holds where the rules allow it (fence.ServeTakeOvers).
package takeover

import (
	"context"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
)

// Reconciler serves the take-over requests of Attachments.
type Reconciler struct {
	// Fencer breaks holds; it reads from the API server, not the cache.
	Fencer *fence.Fencer
	// BlocklisterFor fences a Ceph volume's clients with the operator's key.
	BlocklisterFor fence.BlocklisterFor
	Log            logr.Logger
}

// +kubebuilder:rbac:groups=berth.io,resources=attachments,verbs=get;list;watch;update
// +kubebuilder:rbac:groups=berth.io,resources=nodecleanups,verbs=get;list;create;update
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get
// +kubebuilder:rbac:groups="",resources=pods,verbs=get
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile implements reconcile.Reconciler for an Attachment name.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pending, err := r.Fencer.ServeTakeOvers(ctx, req.Name, r.BlocklisterFor)
	if err != nil {
		r.Log.Error(err, "take-over requests not served", "volume", req.Name)
		return ctrl.Result{}, err
	}
	if pending {
		// The rules may allow it later: a taint, a deleted Node or a moved
		// pod changes no Attachment.
		return ctrl.Result{RequeueAfter: fence.TakeOverRecheck}, nil
	}
	return ctrl.Result{}, nil
}

// SetupWithManager watches Attachments that carry take-over requests.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	asks := predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return hasRequests(e.Object) },
		UpdateFunc:  func(e event.UpdateEvent) bool { return hasRequests(e.ObjectNew) },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(e event.GenericEvent) bool { return hasRequests(e.Object) },
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("take-over").
		For(&v1.Attachment{}, builder.WithPredicates(asks)).
		Complete(r)
}

func hasRequests(o client.Object) bool {
	att, ok := o.(*v1.Attachment)
	return ok && len(att.Spec.TakeOvers) > 0
}
