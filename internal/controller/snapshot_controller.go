package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/volerr"
)

// SnapshotReconciler runs in the agent: it takes and removes the snapshots
// of volumes on its node.
type SnapshotReconciler struct {
	Client  client.Client
	Node    string
	Backend Backend
	Log     logr.Logger
}

// +kubebuilder:rbac:groups=berth.io,resources=snapshots,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=berth.io,resources=snapshots/status,verbs=get;update;patch

// Reconcile implements reconcile.Reconciler.
func (r *SnapshotReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	snap := &v1.Snapshot{}
	if err := r.Client.Get(ctx, req.NamespacedName, snap); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if snap.Spec.Node != r.Node {
		return ctrl.Result{}, nil
	}
	if !snap.DeletionTimestamp.IsZero() {
		if err := r.Backend.DeleteSnapshot(ctx, snap.Name); err != nil {
			return ctrl.Result{}, fmt.Errorf("delete snapshot %s: %w", snap.Name, err)
		}
		r.Log.Info("snapshot deleted", "snapshot", snap.Name)
		if controllerutil.RemoveFinalizer(snap, v1.ImageFinalizer) {
			return ctrl.Result{}, client.IgnoreNotFound(r.Client.Update(ctx, snap))
		}
		return ctrl.Result{}, nil
	}
	if snap.Status.ReadyToUse {
		return ctrl.Result{}, nil
	}
	if controllerutil.AddFinalizer(snap, v1.ImageFinalizer) {
		if err := r.Client.Update(ctx, snap); err != nil {
			return ctrl.Result{}, err
		}
	}
	orig := snap.DeepCopy()
	taken, err := r.Backend.CreateSnapshot(ctx, snap.Name, snap.Spec.SourceVolume)
	switch {
	case errors.Is(err, backend.ErrNotFound), errors.Is(err, backend.ErrExists), errors.Is(err, backend.ErrNoSpace), errors.Is(err, volerr.ErrInvalid),
		errors.Is(err, backend.ErrSourceInUse):
		snap.Status.Message = err.Error()
		cond := metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: backendReason(err), Message: err.Error()}
		meta.SetStatusCondition(&snap.Status.Conditions, cond)
		if perr := r.Client.Status().Patch(ctx, snap, client.MergeFrom(orig)); perr != nil {
			return ctrl.Result{}, perr
		}
		return ctrl.Result{RequeueAfter: time.Minute}, nil
	case err != nil:
		return ctrl.Result{}, err
	}
	created := metav1.NewTime(taken.CreatedAt)
	snap.Status = v1.SnapshotStatus{ReadyToUse: true, Size: resource.NewQuantity(taken.Size, resource.BinarySI), CreatedAt: &created,
		Conditions: snap.Status.Conditions}
	meta.SetStatusCondition(&snap.Status.Conditions, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionTrue,
		Reason: "SnapshotTaken", Message: "copy taken on node " + r.Node})
	r.Log.Info("snapshot taken", "snapshot", snap.Name, "source", snap.Spec.SourceVolume)
	return ctrl.Result{}, client.IgnoreNotFound(r.Client.Status().Patch(ctx, snap, client.MergeFrom(orig)))
}

// SetupWithManager registers the reconciler.
func (r *SnapshotReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).For(&v1.Snapshot{}).Named("snapshot").Complete(r)
}
