package storagecluster

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// ReasonHolderDeleted is the Event, on the node and on the StorageCluster,
// of a holder pod being deleted.
const ReasonHolderDeleted = "HolderDeleted"

// HolderEvents tells, once per holder pod being deleted, what its deletion
// means for its node: the holder is what keeps the node's storage network,
// and neither the mover nor the holder can say so (neither talks to the
// API server).
type HolderEvents struct {
	Client    client.Client
	Recorder  record.EventRecorder
	Namespace string
	Log       logr.Logger
	// told is the holder pods already reported, by name: a deleted pod is
	// updated until it is gone, and is reported once. Reconciles run one
	// at a time (the controller's default), so no lock.
	told map[types.NamespacedName]types.UID
}

// SetupWithManager watches berth's holder pods in the operator's namespace.
func (h *HolderEvents) SetupWithManager(mgr ctrl.Manager) error {
	h.told = map[types.NamespacedName]types.UID{}
	isHolder := predicate.NewPredicateFuncs(func(o client.Object) bool {
		l := o.GetLabels()
		return o.GetNamespace() == h.Namespace && l[labelComponent] == componentHolder && l[labelManagedBy] == managedBy
	})
	return ctrl.NewControllerManagedBy(mgr).
		For(&corev1.Pod{}, builder.WithPredicates(isHolder)).
		Named("holder-events").
		Complete(h)
}

// Reconcile records the Events of a holder pod being deleted.
func (h *HolderEvents) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pod := &corev1.Pod{}
	if err := h.Client.Get(ctx, req.NamespacedName, pod); err != nil {
		if apierrors.IsNotFound(err) {
			delete(h.told, req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	if pod.DeletionTimestamp.IsZero() || h.told[req.NamespacedName] == pod.UID {
		return ctrl.Result{}, nil
	}
	cluster := pod.Labels[labelInstance]
	sc := &v1.StorageCluster{}
	if err := h.Client.Get(ctx, client.ObjectKey{Name: cluster}, sc); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	msg := holderDeletedMessage(pod, sc)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: pod.Spec.NodeName}}
	if pod.Spec.NodeName != "" {
		// The Event names the node by UID when it can be read; by name
		// otherwise, which kubectl describe finds as well.
		_ = h.Client.Get(ctx, client.ObjectKeyFromObject(node), node)
		h.Recorder.Event(node, corev1.EventTypeWarning, ReasonHolderDeleted, msg)
	}
	if sc.UID != "" {
		h.Recorder.Event(sc, corev1.EventTypeWarning, ReasonHolderDeleted, msg)
	}
	h.told[req.NamespacedName] = pod.UID
	h.Log.Info("holder pod deleted", "pod", req.NamespacedName, "node", pod.Spec.NodeName, "storageCluster", cluster)
	return ctrl.Result{}, nil
}

// holderDeletedMessage says what pod's deletion means for its node, in
// sc's mode (sc empty: the cluster is gone).
func holderDeletedMessage(pod *corev1.Pod, sc *v1.StorageCluster) string {
	who := fmt.Sprintf("holder pod %s of StorageCluster %s on node %s is being deleted", pod.Name, pod.Labels[labelInstance], pod.Spec.NodeName)
	switch {
	case sc.UID == "" || !wantsHolder(sc):
		return who + ": the cluster no longer uses a storage network on this node"
	case sc.Spec.Network.MultusMode() == v1.MultusModeMover:
		return who + ": the mover removes its copy of the public interface, so the node has no " + sc.Spec.Network.Selectors.Public +
			" storage network (the cluster's volumes on it cannot reach their storage over it) until the new holder runs and the mover copies its interface, with a new address"
	default:
		return who + ": its network namespace loses the public interface, so the volumes whose storage connections the agent made in it lose the " +
			sc.Spec.Network.Selectors.Public + " storage network until they are staged again; volumes staged after the new holder runs use its namespace"
	}
}
