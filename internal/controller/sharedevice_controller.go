package controller

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/volerr"
	"github.com/berth-io/berth/internal/volmap"
)

// ReasonShareDeviceGrowsAtRestart is the Warning Event on a Volume whose
// share manager's device cannot grow online on this node (nbd).
const ReasonShareDeviceGrowsAtRestart = "ShareDeviceGrowsAtRestart"

// DeviceGrower grows this node's device of a staged volume to its image's
// size (the agent's Expand of a block request) and returns that size.
type DeviceGrower func(ctx context.Context, volume string) (int64, error)

// ShareDeviceReconciler runs in every node's agent. A read-write-many
// filesystem volume's device is held by its share manager alone, whose
// stage is the only one of the volume; no NodeExpandVolume ever reaches it
// (workloads' publishes are NFS mounts). So when the volume's image grew
// (status.capacity), the agent of the node holding that stage grows the
// device, and the share manager, which watches its device's size, grows
// the filesystem it serves. Each capacity is handled once per agent.
type ShareDeviceReconciler struct {
	// Client reads Volumes and Attachments; the agent's is uncached, as
	// its cache lacks the ceph Volumes.
	Client   client.Reader
	Node     string
	Grow     DeviceGrower
	Recorder record.EventRecorder
	Log      logr.Logger

	handled volmap.Map[int64] // volume -> the capacity its device was grown to (0: none)
}

// +kubebuilder:rbac:groups=berth.io,resources=volumes,verbs=get;list;watch
// +kubebuilder:rbac:groups=berth.io,resources=attachments,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile grows one volume's share device when it is on this node.
func (r *ShareDeviceReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var vol v1.Volume
	if found, err := getVolumeOrForget(ctx, r.Client, req.NamespacedName, &vol, &r.handled); !found {
		return ctrl.Result{}, err
	}
	if !vol.Spec.ServedOverNFS() || vol.Status.Capacity == nil || atLeast(r.handled.Get(vol.Name), vol.Status.Capacity.Value()) {
		return ctrl.Result{}, nil
	}
	want := vol.Status.Capacity.Value()
	var att v1.Attachment
	if err := r.Client.Get(ctx, req.NamespacedName, &att); client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, err
	}
	staged := false
	for i := range att.Spec.Attachments {
		if e := &att.Spec.Attachments[i]; e.Node == r.Node && e.IsStage() {
			staged = true
		}
	}
	if !staged {
		// A stage made later attaches the device at the image's size.
		r.handled.Put(vol.Name, want)
		return ctrl.Result{}, nil
	}
	log := r.Log.WithValues("volume", vol.Name, "capacity", want)
	size, err := r.Grow(ctx, vol.Name)
	switch {
	case errors.Is(err, volerr.ErrPrecondition):
		log.Info("the share's device cannot grow online here; it grows when the share manager restarts", "err", err.Error())
		r.Recorder.Eventf(&vol, corev1.EventTypeWarning, ReasonShareDeviceGrowsAtRestart,
			"node %s: the device of this volume's share manager cannot grow online (%v); the share serves the new size once its share-manager pod restarts", r.Node, err)
		r.handled.Put(vol.Name, want)
		return ctrl.Result{}, nil
	case err != nil:
		return ctrl.Result{}, fmt.Errorf("grow the share device of volume %s: %w", vol.Name, err)
	}
	log.Info("grew the share manager's device; the share manager grows its filesystem", "size", size)
	r.handled.Put(vol.Name, want)
	return ctrl.Result{}, nil
}

// SharedVolumes selects the Volumes served by a share manager (the
// operator labels them): their workloads may mount them on any node, and a
// ceph volume's share manager may run on any node, so an agent's cache of
// its own node's Volumes lacks some of them.
func SharedVolumes() labels.Selector {
	return labels.SelectorFromSet(labels.Set{v1.SharedLabel: "true"})
}

// atLeast: a device grown to got needs no growing to want.
func atLeast(got, want int64) bool { return got >= want }

// SetupWithManager watches the read-write-many filesystem Volumes in the
// manager's cache and in each of extra (an agent's cache of SharedVolumes).
func (r *ShareDeviceReconciler) SetupWithManager(mgr ctrl.Manager, extra ...cache.Cache) error {
	return volumeController(mgr, "sharedevice", func(v *v1.Volume) bool { return v.Spec.ServedOverNFS() }, extra).Complete(r)
}

// volumeController is a controller of the Volumes that keep passes, in the
// manager's cache and in each of extra.
func volumeController(mgr ctrl.Manager, name string, keep func(*v1.Volume) bool, extra []cache.Cache) *builder.Builder {
	b := ctrl.NewControllerManagedBy(mgr).Named(name).
		For(&v1.Volume{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			v, ok := o.(*v1.Volume)
			return ok && keep(v)
		})))
	for _, c := range extra {
		b = b.WatchesRawSource(source.Kind(c, &v1.Volume{}, &handler.TypedEnqueueRequestForObject[*v1.Volume]{},
			predicate.NewTypedPredicateFuncs(keep)))
	}
	return b
}

// getVolumeOrForget reads the Volume name into vol; when it is gone it
// forgets what handled holds for it (a volume of the same name later is
// another one) and returns false.
func getVolumeOrForget[T any](ctx context.Context, c client.Reader, name types.NamespacedName, vol *v1.Volume, handled *volmap.Map[T]) (bool, error) {
	err := c.Get(ctx, name, vol)
	if apierrors.IsNotFound(err) {
		handled.Take(name.Name)
		return false, nil
	}
	return err == nil, err
}
