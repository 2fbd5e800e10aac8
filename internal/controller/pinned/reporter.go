// Package pinned tells users why a pod waits for a volume that cannot move:
// a local-backend volume lives on one node's disk, and when that node is
// lost (tainted out-of-service, or its Node object deleted) no lock breaking
// can bring the volume elsewhere. The scheduler only says "volume node
// affinity conflict"; the Reporter says which node holds the data, that the
// data is kept there, and that the pod waits until that node is back.
package pinned

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
)

// ConditionNodeAvailable is the Volume condition that says whether the node
// holding a pinned volume is in service.
const ConditionNodeAvailable = "NodeAvailable"

// Condition reasons and the Event reason.
const (
	ReasonNodeOutOfService = "NodeOutOfService"
	ReasonNodeGone         = "NodeGone"
	ReasonNodeInService    = "NodeInService"
	EventPinned            = "VolumePinnedToLostNode"
)

// DefaultRecheck is how often a lost node's volumes are looked at again, so
// that pods created after the node was lost are told too.
const DefaultRecheck = 30 * time.Second

// Reporter reconciles Nodes: for each local volume on a lost node it sets
// the Volume's NodeAvailable condition and records a Warning Event on the
// claim and on every pod that waits for it elsewhere.
type Reporter struct {
	Client client.Client
	// Reader reads PersistentVolumes, claims and pods uncached: they are
	// needed only while a node is lost, not worth a cluster-wide cache.
	Reader   client.Reader
	Recorder record.EventRecorder
	Log      logr.Logger
	// Recheck: DefaultRecheck when zero.
	Recheck time.Duration
}

// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=berth.io,resources=volumes,verbs=get;list;watch
// +kubebuilder:rbac:groups=berth.io,resources=volumes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=berth.io,resources=storageclusters,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=persistentvolumes,verbs=get
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get
// +kubebuilder:rbac:groups="",resources=pods,verbs=list
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile implements reconcile.Reconciler for a Node name.
func (r *Reporter) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	node := &corev1.Node{}
	reason := ""
	switch err := r.Client.Get(ctx, req.NamespacedName, node); {
	case apierrors.IsNotFound(err):
		reason = ReasonNodeGone
	case err != nil:
		return ctrl.Result{}, fmt.Errorf("get node %s: %w", req.Name, err)
	case fence.OutOfService(node):
		reason = ReasonNodeOutOfService
	}
	var vols v1.VolumeList
	if err := r.Client.List(ctx, &vols, client.MatchingLabels{v1.NodeLabel: req.Name}); err != nil {
		return ctrl.Result{}, fmt.Errorf("list volumes of node %s: %w", req.Name, err)
	}
	for i := range vols.Items {
		vol := &vols.Items[i]
		if vol.Spec.Node != req.Name || !vol.DeletionTimestamp.IsZero() {
			continue
		}
		pinned, err := r.pinnedToNode(ctx, vol)
		if err != nil {
			return ctrl.Result{}, err
		}
		if !pinned {
			continue
		}
		if err := r.setCondition(ctx, vol, reason); err != nil {
			return ctrl.Result{}, err
		}
		if reason != "" {
			if err := r.tell(ctx, vol, reason); err != nil {
				return ctrl.Result{}, err
			}
		}
	}
	if reason == "" || len(vols.Items) == 0 {
		return ctrl.Result{}, nil
	}
	recheck := r.Recheck
	if recheck == 0 {
		recheck = DefaultRecheck
	}
	return ctrl.Result{RequeueAfter: recheck}, nil
}

// pinnedToNode: the volume's StorageCluster keeps volumes on one node's disk.
// A missing cluster reads as the default backend, local.
func (r *Reporter) pinnedToNode(ctx context.Context, vol *v1.Volume) (bool, error) {
	if vol.Spec.StorageCluster == "" {
		return true, nil
	}
	sc := &v1.StorageCluster{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: vol.Spec.StorageCluster}, sc); err != nil {
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, fmt.Errorf("get StorageCluster %s: %w", vol.Spec.StorageCluster, err)
	}
	return sc.Spec.Backend == "" || sc.Spec.Backend == v1.BackendLocal, nil
}

// setCondition records whether the volume's node is available; a volume that
// never lost its node gets no condition at all.
func (r *Reporter) setCondition(ctx context.Context, vol *v1.Volume, reason string) error {
	cur := meta.FindStatusCondition(vol.Status.Conditions, ConditionNodeAvailable)
	want := metav1.Condition{
		Type: ConditionNodeAvailable, Status: metav1.ConditionTrue, Reason: ReasonNodeInService,
		ObservedGeneration: vol.Generation,
		Message:            fmt.Sprintf("node %s, which holds the data, is in service", vol.Spec.Node),
	}
	if reason != "" {
		want.Status, want.Reason, want.Message = metav1.ConditionFalse, reason, lostMessage(vol, reason)
	}
	if (cur == nil && reason == "") || (cur != nil && cur.Status == want.Status && cur.Reason == want.Reason) {
		return nil
	}
	orig := vol.DeepCopy()
	meta.SetStatusCondition(&vol.Status.Conditions, want)
	if err := r.Client.Status().Patch(ctx, vol, client.MergeFrom(orig)); err != nil {
		return client.IgnoreNotFound(err)
	}
	r.Log.Info("volume node availability", "volume", vol.Name, "node", vol.Spec.Node, "reason", want.Reason)
	return nil
}

func lostMessage(vol *v1.Volume, reason string) string {
	what := "is out of service"
	if reason == ReasonNodeGone {
		what = "is gone from the cluster"
	}
	return fmt.Sprintf("volume %s is stored on node %s's disk (local backend) and cannot move to another node; "+
		"node %s %s: pods that use it wait until the node is back, and the data stays on that node",
		vol.Name, vol.Spec.Node, vol.Spec.Node, what)
}

// tell records the Warning on the volume's claim and on each pod of the
// claim that is not on the lost node (those are the ones left waiting).
func (r *Reporter) tell(ctx context.Context, vol *v1.Volume, reason string) error {
	msg := lostMessage(vol, reason)
	r.Recorder.Event(vol, corev1.EventTypeWarning, EventPinned, msg)
	claim, err := r.claimOf(ctx, vol)
	if err != nil || claim == nil {
		return err
	}
	r.Recorder.Event(claim, corev1.EventTypeWarning, EventPinned, msg)
	var pods corev1.PodList
	if err := r.Reader.List(ctx, &pods, client.InNamespace(claim.Namespace)); err != nil {
		return fmt.Errorf("list pods in %s: %w", claim.Namespace, err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName == vol.Spec.Node || !p.DeletionTimestamp.IsZero() || !usesClaim(p, claim.Name) {
			continue
		}
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		r.Recorder.Event(p, corev1.EventTypeWarning, EventPinned, msg)
	}
	return nil
}

// claimOf finds the claim bound to the volume's PersistentVolume: the PV is
// named as Kubernetes asked at CreateVolume, and must carry this volume's
// handle (a PV of another driver with that name is not ours).
func (r *Reporter) claimOf(ctx context.Context, vol *v1.Volume) (*corev1.PersistentVolumeClaim, error) {
	pvName := vol.Annotations[v1.CSINameAnnotation]
	if pvName == "" {
		return nil, nil // a Flexvolume volume made without a claim
	}
	pv := &corev1.PersistentVolume{}
	if err := r.Reader.Get(ctx, client.ObjectKey{Name: pvName}, pv); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	csi := pv.Spec.CSI
	if csi == nil || csi.Driver != v1.DriverName || csi.VolumeHandle != vol.Name || pv.Spec.ClaimRef == nil {
		return nil, nil
	}
	claim := &corev1.PersistentVolumeClaim{}
	key := client.ObjectKey{Namespace: pv.Spec.ClaimRef.Namespace, Name: pv.Spec.ClaimRef.Name}
	if err := r.Reader.Get(ctx, key, claim); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	if claim.Spec.VolumeName != pv.Name {
		return nil, nil
	}
	return claim, nil
}

func usesClaim(p *corev1.Pod, claim string) bool {
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim {
			return true
		}
	}
	return false
}

// SetupWithManager watches Nodes; a deleted Node is reconciled too (its
// volumes are then on a node that is gone).
func (r *Reporter) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("pinned-volumes").
		For(&corev1.Node{}).
		Complete(r)
}
