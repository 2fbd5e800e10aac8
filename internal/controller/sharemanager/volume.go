package sharemanager

import (
	"context"
	"fmt"
	"slices"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// VolumeReconciler gives each read-write-many filesystem Volume a
// ShareManager named after it (owned by the Volume, so it goes with it) and
// mirrors the share's state and endpoint into the Volume's status.
type VolumeReconciler struct {
	Client  client.Client
	Options Options
	Log     logr.Logger
}

// +kubebuilder:rbac:groups=berth.io,namespace=berth-system,resources=sharemanagers,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=berth.io,resources=volumes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=berth.io,resources=volumes/finalizers,verbs=update
// +kubebuilder:rbac:groups=berth.io,resources=volumes/status,verbs=get;update;patch

// Reconcile implements reconcile.Reconciler.
func (r *VolumeReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	vol := &v1.Volume{}
	if err := r.Client.Get(ctx, req.NamespacedName, vol); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !vol.Spec.ServedOverNFS() || !vol.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	if vol.Labels[v1.SharedLabel] != "true" {
		// The agents of the nodes that mount the share watch it by this
		// label (their remount checks after a failover): a local volume's
		// node label names only the node that holds its image.
		orig := vol.DeepCopy()
		metav1.SetMetaDataLabel(&vol.ObjectMeta, v1.SharedLabel, "true")
		if err := r.Client.Patch(ctx, vol, client.MergeFrom(orig)); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
	}
	sm := &v1.ShareManager{ObjectMeta: metav1.ObjectMeta{Name: vol.Name, Namespace: r.Options.Namespace}}
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(sm), sm)
	switch {
	case apierrors.IsNotFound(err):
		sm.Spec = v1.ShareManagerSpec{Volume: vol.Name, Image: r.Options.Image}
		if err := controllerutil.SetControllerReference(vol, sm, r.Client.Scheme()); err != nil {
			return ctrl.Result{}, err
		}
		if err := r.Client.Create(ctx, sm); err != nil {
			return ctrl.Result{}, fmt.Errorf("create ShareManager %s: %w", vol.Name, err)
		}
		r.Log.Info("share manager created", "volume", vol.Name, "namespace", sm.Namespace)
	case err != nil:
		return ctrl.Result{}, err
	case sm.Spec.Image != r.Options.Image:
		// A new operator image moves share managers to it; the running pod
		// keeps serving until its next start.
		orig := sm.DeepCopy()
		sm.Spec.Image = r.Options.Image
		if err := r.Client.Patch(ctx, sm, client.MergeFrom(orig)); err != nil {
			return ctrl.Result{}, err
		}
	}
	state := sm.Status.State
	if state == "" {
		state = v1.ShareUnknown
	}
	if vol.Status.ShareState == state && vol.Status.ShareEndpoint == sm.Status.Endpoint && slices.Equal(vol.Status.ShareNodes, sm.Status.AdmittedNodes) {
		return ctrl.Result{}, nil
	}
	orig := vol.DeepCopy()
	vol.Status.ShareState, vol.Status.ShareEndpoint = state, sm.Status.Endpoint
	// The nodes wait for theirs before they mount (agent.waitShare).
	vol.Status.ShareNodes = sm.Status.AdmittedNodes
	if err := r.Client.Status().Patch(ctx, vol, client.MergeFrom(orig)); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	return ctrl.Result{}, nil
}

// SetupWithManager registers the reconciler.
func (r *VolumeReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1.Volume{}).
		Owns(&v1.ShareManager{}).
		Named("volume-share").
		Complete(r)
}
