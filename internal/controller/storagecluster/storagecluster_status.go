package storagecluster

import (
	"context"
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// Condition types a StorageCluster reports besides Ready.
const (
	ConditionAgentReady      = "AgentReady"
	ConditionKeeperReady     = "KeeperReady"
	ConditionControllerReady = "ControllerReady"
	// ConditionHolderReady and ConditionMoverReady are there while the
	// cluster has a holder (multus with a public network), and the mover mode.
	ConditionHolderReady = "HolderReady"
	ConditionMoverReady  = "MoverReady"
)

// Condition reasons.
const (
	ReasonReady       = "Ready"
	ReasonProgressing = "Progressing"
	ReasonNoNodes     = "NoMatchingNodes"
	ReasonApplyFailed = "ApplyFailed"
	ReasonNotReady    = "ComponentsNotReady"
	ReasonDeleting    = "WaitingForNodeCleanup"
	ReasonInvalidSpec = "InvalidSpec"
	// ReasonDataDirOverlap: the data dir overlaps another cluster's; the
	// agent does not serve it (condition and Event).
	ReasonDataDirOverlap = "DataDirOverlap"
	// ReasonForeignObject: a class of this cluster's name exists and this
	// cluster did not make it (Event; Ready says ApplyFailed).
	ReasonForeignObject = "ForeignObject"
)

// ConditionDataDirServed says whether the node-wide agent mounts this
// cluster's data dir.
const ConditionDataDirServed = "DataDirServed"

// event records an Event when a recorder is set.
func (r *Reconciler) event(sc *v1.StorageCluster, typ, reason, msg string) {
	if r.Recorder != nil {
		r.Recorder.Event(sc, typ, reason, msg)
	}
}

// writeRefused marks a cluster whose data dir the agent does not serve.
func (r *Reconciler) writeRefused(ctx context.Context, sc *v1.StorageCluster, why error) error {
	before := sc.DeepCopy()
	sc.Status.Phase = v1.StorageClusterError
	sc.Status.ObservedGeneration = sc.Generation
	for _, c := range []metav1.Condition{
		{Type: ConditionDataDirServed, Status: metav1.ConditionFalse, Reason: ReasonDataDirOverlap, Message: why.Error()},
		{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonDataDirOverlap, Message: why.Error()},
	} {
		c.ObservedGeneration = sc.Generation
		meta.SetStatusCondition(&sc.Status.Conditions, c)
	}
	return r.patchStatus(ctx, before, sc)
}

// writeStatus records what obs says, only when something changed.
func (r *Reconciler) writeStatus(ctx context.Context, sc *v1.StorageCluster, obs observed, applyErr error, backend, network metav1.Condition) error {
	before := sc.DeepCopy()
	gen := sc.Generation
	conds := []metav1.Condition{
		daemonSetCondition(ConditionAgentReady, "agent", obs.agent, true),
		daemonSetCondition(ConditionKeeperReady, "keeper", obs.keeper, true),
		deploymentCondition(obs.controller),
		{Type: ConditionDataDirServed, Status: metav1.ConditionTrue, Reason: ReasonReady, Message: "the node-wide agent mounts " + sc.Spec.DataDir},
		backend,
		network,
	}
	conds = append(conds, multusConditions(sc, obs)...)
	ready := metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonReady, Message: "all components are ready"}
	var notReady []string
	for _, c := range conds {
		if c.Status != metav1.ConditionTrue {
			notReady = append(notReady, c.Type)
		}
	}
	phase := v1.StorageClusterReady
	switch {
	case applyErr != nil:
		ready = metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonApplyFailed, Message: applyErr.Error()}
		phase = v1.StorageClusterError
	case backend.Status != metav1.ConditionTrue:
		// The backend's own reason says what to fix (a key, a pool, ...).
		ready = metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: backend.Reason, Message: "backend: " + backend.Message}
		phase = v1.StorageClusterError
	case network.Status != metav1.ConditionTrue:
		ready = metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: network.Reason, Message: "network: " + network.Message}
		phase = v1.StorageClusterError
	case len(notReady) > 0:
		ready = metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonNotReady, Message: "not ready: " + strings.Join(notReady, ", ")}
		phase = v1.StorageClusterProgressing
	}
	for _, c := range append(conds, ready) {
		c.ObservedGeneration = gen
		meta.SetStatusCondition(&sc.Status.Conditions, c)
	}
	sc.Status.Phase = phase
	sc.Status.ObservedGeneration = gen
	return r.patchStatus(ctx, before, sc)
}

// multusConditions are the holder's and mover's readiness where sc has
// them; a condition sc no longer has leaves its status.
func multusConditions(sc *v1.StorageCluster, obs observed) []metav1.Condition {
	var conds []metav1.Condition
	if wantsHolder(sc) {
		conds = append(conds, daemonSetCondition(ConditionHolderReady, "holder", obs.holder, false))
	} else {
		meta.RemoveStatusCondition(&sc.Status.Conditions, ConditionHolderReady)
	}
	if wantsHolder(sc) && sc.Spec.Network.MultusMode() == v1.MultusModeMover {
		conds = append(conds, daemonSetCondition(ConditionMoverReady, "mover", obs.mover, false))
	} else {
		meta.RemoveStatusCondition(&sc.Status.Conditions, ConditionMoverReady)
	}
	return conds
}

// writeDeleting marks a deleting cluster and names the nodes it waits for.
func (r *Reconciler) writeDeleting(ctx context.Context, sc *v1.StorageCluster, pending []string) error {
	before := sc.DeepCopy()
	sc.Status.Phase = v1.StorageClusterDeleting
	meta.SetStatusCondition(&sc.Status.Conditions, metav1.Condition{
		Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonDeleting,
		ObservedGeneration: sc.Generation,
		Message:            "waiting for the agents of nodes " + strings.Join(pending, ", ") + " to detach this cluster's volumes",
	})
	return r.patchStatus(ctx, before, sc)
}

// writeInvalid marks a cluster whose spec berth refuses; nothing is deployed.
func (r *Reconciler) writeInvalid(ctx context.Context, sc *v1.StorageCluster, why error) error {
	before := sc.DeepCopy()
	sc.Status.Phase = v1.StorageClusterError
	sc.Status.ObservedGeneration = sc.Generation
	meta.SetStatusCondition(&sc.Status.Conditions, metav1.Condition{
		Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonInvalidSpec,
		ObservedGeneration: sc.Generation, Message: why.Error(),
	})
	return r.patchStatus(ctx, before, sc)
}

func (r *Reconciler) patchStatus(ctx context.Context, before, sc *v1.StorageCluster) error {
	if equality.Semantic.DeepEqual(before.Status, sc.Status) {
		return nil
	}
	if err := r.Client.Status().Patch(ctx, sc, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("status: %w", err)
	}
	return nil
}

// daemonSetCondition says whether every wanted pod of ds runs and is
// available. No matching node is not ready: the cluster cannot serve a
// volume anywhere. rolling says whether pods must also run the current
// template (the DaemonSets that roll: the agent's and the keeper's, which
// hands its connections over).
func daemonSetCondition(typ, what string, ds *appsv1.DaemonSet, rolling bool) metav1.Condition {
	c := metav1.Condition{Type: typ, Status: metav1.ConditionFalse, Reason: ReasonProgressing}
	st := ds.Status
	switch {
	case ds.ResourceVersion == "":
		c.Message = fmt.Sprintf("%s DaemonSet not created", what)
	case st.ObservedGeneration < ds.Generation:
		c.Message = fmt.Sprintf("%s DaemonSet generation %d not yet observed", what, ds.Generation)
	case st.DesiredNumberScheduled == 0:
		c.Reason = ReasonNoNodes
		c.Message = fmt.Sprintf("no node matches the %s's node selector and tolerations", what)
	case rolling && st.UpdatedNumberScheduled < st.DesiredNumberScheduled:
		c.Message = fmt.Sprintf("%s rollout: %d of %d pods updated", what, st.UpdatedNumberScheduled, st.DesiredNumberScheduled)
	case st.NumberAvailable < st.DesiredNumberScheduled:
		c.Message = fmt.Sprintf("%s: %d of %d pods available", what, st.NumberAvailable, st.DesiredNumberScheduled)
	default:
		c.Status, c.Reason = metav1.ConditionTrue, ReasonReady
		c.Message = fmt.Sprintf("%s: %d of %d pods available", what, st.NumberAvailable, st.DesiredNumberScheduled)
	}
	return c
}

// deploymentCondition says whether the CSI controller is rolled out and available.
func deploymentCondition(d *appsv1.Deployment) metav1.Condition {
	c := metav1.Condition{Type: ConditionControllerReady, Status: metav1.ConditionFalse, Reason: ReasonProgressing}
	st := d.Status
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	switch {
	case d.ResourceVersion == "":
		c.Message = "CSI controller Deployment not created"
	case st.ObservedGeneration < d.Generation:
		c.Message = fmt.Sprintf("CSI controller Deployment generation %d not yet observed", d.Generation)
	case st.UpdatedReplicas < want:
		c.Message = fmt.Sprintf("CSI controller rollout: %d of %d replicas updated", st.UpdatedReplicas, want)
	case !deploymentAvailable(d):
		c.Message = "CSI controller Deployment not available"
	default:
		c.Status, c.Reason = metav1.ConditionTrue, ReasonReady
		c.Message = fmt.Sprintf("CSI controller: %d of %d replicas available", st.AvailableReplicas, want)
	}
	return c
}

func deploymentAvailable(d *appsv1.Deployment) bool {
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentAvailable {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
