package storagecluster

import (
	"context"

	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// The CSI controller's PodDisruptionBudget, in the operator's namespace.
// +kubebuilder:rbac:groups=policy,namespace=berth-system,resources=poddisruptionbudgets,verbs=get;list;watch;create;update;patch;delete

// controllerBudget renders the CSI controller's PodDisruptionBudget:
// drains stop one replica at a time, so a leader or a standby runs.
func (r *Reconciler) controllerBudget(pdb *policyv1.PodDisruptionBudget) {
	setLabels(&pdb.ObjectMeta, objectLabels(NodeWide, componentController))
	pdb.Spec = policyv1.PodDisruptionBudgetSpec{
		MaxUnavailable: ptr.To(intstr.FromInt32(1)),
		Selector:       &metav1.LabelSelector{MatchLabels: selectorLabels(NodeWide, componentController)},
	}
}

// applyControllerBudget keeps the budget while more than one CSI
// controller runs, and removes berth's otherwise: the budget of a single
// replica would block every drain or allow nothing.
func (r *Reconciler) applyControllerBudget(ctx context.Context, plan nodeWidePlan) error {
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: r.meta(componentController)}
	if plan.controller.replicas > 1 {
		return r.ensureNodeWide(ctx, pdb, func() { r.controllerBudget(pdb) })
	}
	return r.removeNodeWide(ctx, pdb)
}
