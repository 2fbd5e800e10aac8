// Package controller holds berth's controller-runtime reconcilers: the
// agent's volume and snapshot reconcilers (node side) and the operator's.
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
)

// Backend is what the node-side reconcilers need of a volume backend.
type Backend interface {
	Create(ctx context.Context, id string, size int64) (backend.Image, error)
	CreateFromSnapshot(ctx context.Context, id, snapshotID string, size int64) (backend.Image, error)
	CreateFromVolume(ctx context.Context, id, sourceID string, size int64) (backend.Image, error)
	Get(ctx context.Context, id string) (backend.Image, error)
	Delete(ctx context.Context, id string) error
	Expand(ctx context.Context, id string, size int64) (backend.Image, error)
	CreateSnapshot(ctx context.Context, snapID, sourceID string) (backend.Snapshot, error)
	DeleteSnapshot(ctx context.Context, id string) error
}

// reasonNoSpace marks a volume whose image does not fit on its node; the CSI
// controller answers ResourceExhausted for it.
const reasonNoSpace = "NoSpace"

// VolumeReconciler runs in the agent: it makes, grows and removes the images
// of the Volumes assigned to its node.
type VolumeReconciler struct {
	Client  client.Client
	Node    string
	Backend Backend
	Log     logr.Logger
}

// +kubebuilder:rbac:groups=berth.io,resources=volumes,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=berth.io,resources=volumes/status,verbs=get;update;patch

// Reconcile implements reconcile.Reconciler.
func (r *VolumeReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	vol := &v1.Volume{}
	if err := r.Client.Get(ctx, req.NamespacedName, vol); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if vol.Spec.Node != r.Node {
		return ctrl.Result{}, nil
	}
	log := r.Log.WithValues("volume", vol.Name)

	if !vol.DeletionTimestamp.IsZero() {
		if err := r.Backend.Delete(ctx, vol.Name); err != nil {
			return ctrl.Result{}, fmt.Errorf("delete image of %s: %w", vol.Name, err)
		}
		log.Info("image deleted")
		if controllerutil.RemoveFinalizer(vol, v1.ImageFinalizer) {
			if err := r.Client.Update(ctx, vol); err != nil {
				return ctrl.Result{}, client.IgnoreNotFound(err)
			}
		}
		return ctrl.Result{}, nil
	}
	if controllerutil.AddFinalizer(vol, v1.ImageFinalizer) {
		if err := r.Client.Update(ctx, vol); err != nil {
			return ctrl.Result{}, err
		}
	}

	img, err := r.ensureImage(ctx, vol)
	if err != nil {
		if errors.Is(err, backend.ErrNoSpace) || errors.Is(err, backend.ErrInvalid) || errors.Is(err, backend.ErrExists) || errors.Is(err, backend.ErrNotFound) {
			// Retrying does not help until something changes: say why and wait.
			log.Info("cannot make image", "reason", err.Error())
			return ctrl.Result{RequeueAfter: time.Minute}, r.setStatus(ctx, vol, v1.VolumeError, nil, "", err)
		}
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, r.setStatus(ctx, vol, v1.VolumeAvailable, &img.Size, img.Path, nil)
}

func (r *VolumeReconciler) ensureImage(ctx context.Context, vol *v1.Volume) (backend.Image, error) {
	want := vol.Spec.Size.Value()
	img, err := r.Backend.Get(ctx, vol.Name)
	switch {
	case errors.Is(err, backend.ErrNotFound):
		switch src := vol.Spec.Source; {
		case src == nil:
			return r.Backend.Create(ctx, vol.Name, want)
		case src.Snapshot != "":
			return r.Backend.CreateFromSnapshot(ctx, vol.Name, src.Snapshot, want)
		default:
			return r.Backend.CreateFromVolume(ctx, vol.Name, src.Volume, want)
		}
	case err != nil:
		return img, err
	case img.Size < want:
		return r.Backend.Expand(ctx, vol.Name, want)
	}
	return img, nil
}

func (r *VolumeReconciler) setStatus(ctx context.Context, vol *v1.Volume, state v1.VolumeState, size *int64, path string, cause error) error {
	orig := vol.DeepCopy()
	vol.Status.State = state
	vol.Status.ObservedGeneration = vol.Generation
	cond := metav1.Condition{Type: v1.ConditionReady, ObservedGeneration: vol.Generation}
	if cause != nil {
		vol.Status.Message = cause.Error()
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "BackendError", cause.Error()
		if errors.Is(cause, backend.ErrNoSpace) {
			cond.Reason = reasonNoSpace
		}
	} else {
		vol.Status.Message = ""
		vol.Status.Capacity = resource.NewQuantity(*size, resource.BinarySI)
		vol.Status.Path = path
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, "ImageReady", "image exists on node "+r.Node
	}
	meta.SetStatusCondition(&vol.Status.Conditions, cond)
	if err := r.Client.Status().Patch(ctx, vol, client.MergeFrom(orig)); err != nil {
		return client.IgnoreNotFound(err)
	}
	return nil
}

// SetupWithManager registers the reconciler.
func (r *VolumeReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).For(&v1.Volume{}).Named("volume").Complete(r)
}
