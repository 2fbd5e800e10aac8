package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/mount"
	"github.com/berth-io/berth/internal/volmap"
)

// Events of the share-mount check, on the workload pod.
const (
	ReasonShareRemount       = "ShareRemount"
	ReasonShareMountBroken   = "ShareMountBroken"
	defaultShareProbeTimeout = 10 * time.Second
)

// ShareProbe checks that the NFS mount at path answers (mount.ProbeShare);
// mount.ErrNotShareMount when path holds none.
type ShareProbe func(ctx context.Context, path string) error

// ShareMountReconciler runs in every node's agent. When a read-write-many
// volume's share manager failed over, the ShareManager controller sets
// Volume.status.remountRequestedAt. Hard NFS mounts of a share that came
// back on the same Service ride the failover by themselves; once the share
// runs again this checks each of this node's workload mounts of the volume
// (the pods in its Attachment), and a mount that does not answer (a stale
// handle, an error) gets its pod deleted when a controller owns it, which
// makes a new pod with a fresh mount (the Longhorn design); a pod nothing
// would recreate gets a Warning Event instead. Each request is handled once
// per agent.
type ShareMountReconciler struct {
	Client   client.Client
	Node     string
	Probe    ShareProbe
	Recorder record.EventRecorder
	Log      logr.Logger
	// ProbeTimeout bounds one mount's check (0: 10 s). A probe of a hard
	// mount that blocks longer counts as broken.
	ProbeTimeout time.Duration

	handled volmap.Map[time.Time] // volume -> the remountRequestedAt handled (zero: none)
}

// +kubebuilder:rbac:groups=berth.io,resources=volumes,verbs=get;list;watch
// +kubebuilder:rbac:groups=berth.io,resources=attachments,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;delete
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile checks one volume's share mounts on this node.
func (r *ShareMountReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var vol v1.Volume
	if found, err := getVolumeOrForget(ctx, r.Client, req.NamespacedName, &vol, &r.handled); !found {
		return ctrl.Result{}, err
	}
	at := vol.Status.RemountRequestedAt
	if vol.Spec.AccessMode != v1.ReadWriteMany || at == nil || notBefore(r.handled.Get(vol.Name), at.Time) {
		return ctrl.Result{}, nil
	}
	if vol.Status.ShareState != v1.ShareRunning {
		return ctrl.Result{}, nil // the share's next state change brings us back
	}
	var att v1.Attachment
	if err := r.Client.Get(ctx, req.NamespacedName, &att); apierrors.IsNotFound(err) {
		r.handled.Put(vol.Name, at.Time)
		return ctrl.Result{}, nil
	} else if err != nil {
		return ctrl.Result{}, err
	}
	var errs []error
	for _, e := range att.Spec.Attachments {
		if e.Node != r.Node || e.PodUID == "" || e.Pod == "" {
			continue
		}
		if err := r.check(ctx, &vol, e); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return ctrl.Result{}, err
	}
	r.handled.Put(vol.Name, at.Time)
	return ctrl.Result{}, nil
}

// check probes one pod's mount and, when it is broken, restarts the pod.
func (r *ShareMountReconciler) check(ctx context.Context, vol *v1.Volume, e v1.AttachmentEntry) error {
	err := r.probe(ctx, e.MountDir)
	log := r.Log.WithValues("volume", vol.Name, "pod", e.PodNamespace+"/"+e.Pod, "mountDir", e.MountDir)
	switch {
	case err == nil:
		log.Info("share mount answers after the failover")
		return nil
	case errors.Is(err, mount.ErrNotShareMount):
		// The share manager's own hold on the device (a block publish),
		// or a workload whose mount is gone: no NFS client to remount.
		return nil
	}
	var pod corev1.Pod
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: e.PodNamespace, Name: e.Pod}, &pod); apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	if string(pod.UID) != e.PodUID || !pod.DeletionTimestamp.IsZero() {
		return nil // another pod by that name, or already going
	}
	if metav1.GetControllerOf(&pod) == nil {
		log.Error(err, "share mount broken after the failover; the pod has no controller to recreate it")
		r.Recorder.Eventf(&pod, corev1.EventTypeWarning, ReasonShareMountBroken,
			"node %s: the NFS mount of volume %s does not answer after its share failed over (%v); delete this pod so that a new one mounts the share again", r.Node, vol.Name, err)
		return nil
	}
	log.Info("share mount broken after the failover: deleting the pod so that its controller makes one with a fresh mount", "err", err.Error())
	r.Recorder.Eventf(&pod, corev1.EventTypeWarning, ReasonShareRemount,
		"node %s: the NFS mount of volume %s does not answer after its share failed over (%v); the pod is deleted so that its controller makes a new one, which mounts the share again", r.Node, vol.Name, err)
	uid := pod.UID
	if err := r.Client.Delete(ctx, &pod, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// probe runs Probe bounded: a check of a hard mount that blocks (the
// kernel waits for the server) is abandoned, not waited for.
func (r *ShareMountReconciler) probe(ctx context.Context, path string) error {
	timeout := r.ProbeTimeout
	if timeout <= 0 {
		timeout = defaultShareProbeTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Probe(ctx, path) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("no answer within %s", timeout)
	}
}

// notBefore: a remount request handled at got covers one made at want.
func notBefore(got, want time.Time) bool { return !got.Before(want) }

// SetupWithManager watches the read-write-many Volumes in the manager's
// cache and in each of extra (an agent's cache of SharedVolumes: a share's
// workloads may run on any node, whichever node holds its image).
func (r *ShareMountReconciler) SetupWithManager(mgr ctrl.Manager, extra ...cache.Cache) error {
	return volumeController(mgr, "sharemount", func(v *v1.Volume) bool { return v.Spec.AccessMode == v1.ReadWriteMany }, extra).Complete(r)
}
