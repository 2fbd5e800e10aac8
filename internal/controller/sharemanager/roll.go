package sharemanager

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// reasonUpgrading: a running share moves to its ShareManager's image.
const reasonUpgrading = "Upgrading"

// rollWait is how soon a share held back from moving to a new image looks
// again (the other share's changes also bring it back).
const rollWait = 10 * time.Second

// outdated tells whether pod runs another image than its ShareManager asks
// for (a new operator sets spec.image).
func outdated(sm *v1.ShareManager, pod *corev1.Pod) bool {
	return len(pod.Spec.Containers) > 0 && sm.Spec.Image != "" && pod.Spec.Containers[0].Image != sm.Spec.Image
}

// roll moves a running share to its ShareManager's image: the pod is
// deleted gracefully (ganesha stops, the device and the Lease are
// released) and the next reconcile starts one on the new image. Clients
// ride that as a server restart: hard mounts wait, then reclaim within
// the grace period. One share at a time: while another share of the
// namespace is not running (starting, failing over, moving), this one
// waits, so an upgrade never stalls two shares at once and stops where a
// new image does not start.
func (r *Reconciler) roll(ctx context.Context, log logr.Logger, sm *v1.ShareManager, pod *corev1.Pod) (ctrl.Result, error) {
	// Reconciles run one at a time today; the lock keeps the check and
	// the delete together should that change.
	r.rolling.Lock()
	defer r.rolling.Unlock()
	list := &v1.ShareManagerList{}
	if err := r.Client.List(ctx, list, client.InNamespace(sm.Namespace)); err != nil {
		return ctrl.Result{}, fmt.Errorf("list ShareManagers: %w", err)
	}
	for _, other := range list.Items {
		if other.Name == sm.Name {
			continue
		}
		switch other.Status.State {
		case v1.ShareRunning, v1.ShareStopped, "":
		default:
			log.Info("share waits to move to the new image: another share is not running",
				"image", sm.Spec.Image, "other", other.Name, "otherState", other.Status.State)
			return ctrl.Result{RequeueAfter: rollWait}, nil
		}
	}
	msg := fmt.Sprintf("moving from %s to %s: pod %s stops gracefully", pod.Spec.Containers[0].Image, sm.Spec.Image, pod.Name)
	// Starting before the delete: the next share to move sees this one.
	if err := r.setStatus(ctx, sm, v1.ShareStarting, pod.Spec.NodeName, reasonUpgrading, msg); err != nil {
		return ctrl.Result{}, err
	}
	log.Info("share manager moves to the new image", "pod", pod.Name, "from", pod.Spec.Containers[0].Image, "to", sm.Spec.Image)
	if r.Recorder != nil {
		r.Recorder.Event(sm, corev1.EventTypeNormal, reasonUpgrading, msg)
	}
	if err := r.Client.Delete(ctx, pod, client.Preconditions{UID: &pod.UID}); client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, fmt.Errorf("delete pod %s: %w", pod.Name, err)
	}
	return ctrl.Result{RequeueAfter: time.Second}, nil
}
