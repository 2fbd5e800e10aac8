// Package controller holds berth's controller-runtime reconcilers: the
// agent's volume and snapshot reconcilers (node side) and the operator's.
package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/mount"
	"github.com/berth-io/berth/internal/volerr"
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

// reasonSourceInUse marks a snapshot or clone refused because its source
// volume could not be held still; the CSI controller answers
// FailedPrecondition for it.
const reasonSourceInUse = "SourceInUse"

// backendReason is the Ready condition reason for a backend error.
func backendReason(err error) string {
	switch {
	case errors.Is(err, backend.ErrNoSpace):
		return reasonNoSpace
	case errors.Is(err, backend.ErrSourceInUse):
		return reasonSourceInUse
	}
	return "BackendError"
}

// reasonInUse marks a deleted volume whose image waits until it is unstaged.
const reasonInUse = "InUseOnNode"

// inUseRetry is how often a deleted volume still in use is looked at again.
const inUseRetry = 10 * time.Second

// VolumeReconciler runs in the agent: it makes, grows and removes the images
// of the Volumes assigned to its node.
type VolumeReconciler struct {
	Client  client.Client
	Node    string
	Backend Backend
	// Loop finds loop devices still on an image: a deleted volume's image
	// stays until none is, so that an unstage retry can still find it.
	Loop mount.Loop
	// Attachments reads Attachments uncached (an agent caches only its own
	// node's objects); nil: Client.
	Attachments client.Reader
	// Recorder, when set, gets an event while deletion waits.
	Recorder record.EventRecorder
	Log      logr.Logger
}

// +kubebuilder:rbac:groups=berth.io,resources=volumes,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=berth.io,resources=volumes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=berth.io,resources=attachments,verbs=get;list;watch

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
		if !controllerutil.ContainsFinalizer(vol, v1.ImageFinalizer) {
			return ctrl.Result{}, nil
		}
		// Unlinking the image under a live loop device would leave an
		// unstage retry (after a crash between unmount and detach) unable
		// to find that device: wait until the volume is unstaged here.
		busy, err := r.inUse(ctx, vol)
		if err != nil {
			return ctrl.Result{}, err
		}
		if busy != "" {
			return ctrl.Result{RequeueAfter: inUseRetry}, r.setWaiting(ctx, log, vol, busy)
		}
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
		if errors.Is(err, backend.ErrNoSpace) || errors.Is(err, volerr.ErrInvalid) || errors.Is(err, backend.ErrExists) || errors.Is(err, backend.ErrNotFound) ||
			errors.Is(err, backend.ErrSourceInUse) {
			// Retrying does not help until something changes: say why and wait.
			log.Info("cannot make image", "reason", err.Error())
			return ctrl.Result{RequeueAfter: time.Minute}, r.setStatus(ctx, vol, v1.VolumeError, nil, "", err)
		}
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, r.setStatus(ctx, vol, v1.VolumeAvailable, &img.Size, img.Path, nil)
}

// inUse says why the volume's image must stay ("" when it may go): this
// node still holds it in its Attachment, or a loop device is on the image.
func (r *VolumeReconciler) inUse(ctx context.Context, vol *v1.Volume) (string, error) {
	reader := r.Attachments
	if reader == nil {
		reader = r.Client
	}
	att := &v1.Attachment{}
	switch err := reader.Get(ctx, client.ObjectKey{Name: vol.Name}, att); {
	case err == nil:
		for _, e := range att.Spec.Attachments {
			if e.Node == r.Node {
				return fmt.Sprintf("still attached on node %s at %s", r.Node, e.MountDir), nil
			}
		}
	case !apierrors.IsNotFound(err):
		return "", fmt.Errorf("read Attachment %s: %w", vol.Name, err)
	}
	img, err := r.Backend.Get(ctx, vol.Name)
	if errors.Is(err, backend.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("image of %s: %w", vol.Name, err)
	}
	dev, found, err := r.Loop.Find(ctx, img.Path)
	if err != nil {
		return "", fmt.Errorf("find loop device of %s: %w", img.Path, err)
	}
	if found {
		return fmt.Sprintf("loop device %s on node %s is still attached to the image", dev, r.Node), nil
	}
	return "", nil
}

// setWaiting tells on the Volume (status and one Event) why its deletion
// waits; a requeue that finds the same reason writes nothing.
func (r *VolumeReconciler) setWaiting(ctx context.Context, log logr.Logger, vol *v1.Volume, why string) error {
	msg := "image deletion waits: " + why
	if vol.Status.Message == msg {
		return nil
	}
	log.Info("image deletion waits: volume still in use", "why", why)
	if r.Recorder != nil {
		r.Recorder.Event(vol, corev1.EventTypeNormal, reasonInUse, msg)
	}
	orig := vol.DeepCopy()
	vol.Status.Message = msg
	meta.SetStatusCondition(&vol.Status.Conditions, metav1.Condition{
		Type: v1.ConditionReady, Status: metav1.ConditionFalse, ObservedGeneration: vol.Generation,
		Reason: reasonInUse, Message: vol.Status.Message,
	})
	if err := r.Client.Status().Patch(ctx, vol, client.MergeFrom(orig)); err != nil {
		return client.IgnoreNotFound(err)
	}
	return nil
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
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, backendReason(cause), cause.Error()
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
