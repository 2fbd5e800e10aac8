package storagecluster_test

import (
	"context"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// TestCSIControllerScale: the CSI controller runs the most replicas any
// cluster asks, and with more than one a PodDisruptionBudget (max one
// unavailable) selects its pods; back to one, the budget goes. Leader
// election goes off only when every cluster turns it off. The operator's
// generated role is enough for the budget's writes.
func TestCSIControllerScale(t *testing.T) {
	suite.Require(t)
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "berth-csi-controller", Namespace: namespace}}
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "berth-csi-controller", Namespace: namespace}}
	scaled := func(what string, replicas int32, elect bool) {
		t.Helper()
		eventually(t, what, func(ctx context.Context) (bool, error) {
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(dep), dep); err != nil {
				return false, client.IgnoreNotFound(err)
			}
			arg, berthArg := "--leader-election", "--leader-elect"
			if !elect {
				arg, berthArg = arg+"=false", berthArg+"=false"
			}
			// berth's own (its pool capacity publisher), then the sidecars'.
			if !slices.Contains(dep.Spec.Template.Spec.Containers[0].Args, berthArg) {
				return false, nil
			}
			for _, c := range dep.Spec.Template.Spec.Containers[1:] {
				if !slices.Contains(c.Args, arg) {
					return false, nil
				}
			}
			return ptr.Deref(dep.Spec.Replicas, 0) == replicas, nil
		})
	}
	budgeted := func(what string, want bool) {
		t.Helper()
		eventually(t, what, func(ctx context.Context) (bool, error) {
			err := env.Client.Get(ctx, client.ObjectKeyFromObject(pdb), pdb)
			return want == (err == nil), client.IgnoreNotFound(err)
		})
	}

	a := newCluster(t, "scale-a", v1.StorageClusterSpec{DataDir: "/srv/scale-a",
		CSIController: v1.CSIControllerSpec{Replicas: ptr.To[int32](2)}})
	scaled("two replicas, electing", 2, true)
	budgeted("a budget for two replicas", true)
	checkNodeWide(t, pdb)
	if u := pdb.Spec.MaxUnavailable; u == nil || u.IntValue() != 1 || pdb.Spec.MinAvailable != nil {
		t.Errorf("budget %+v, want maxUnavailable 1", pdb.Spec)
	}
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(dep.Spec.Template.Labels)) {
		t.Errorf("budget selector %v (%v) misses the controller pods %v", sel, err, dep.Spec.Template.Labels)
	}

	b := newCluster(t, "scale-b", v1.StorageClusterSpec{DataDir: "/srv/scale-b",
		CSIController: v1.CSIControllerSpec{Replicas: ptr.To[int32](3)}})
	scaled("the most replicas any cluster asks", 3, true)

	updateCluster(t, a, func(s *v1.StorageClusterSpec) {
		s.CSIController = v1.CSIControllerSpec{Replicas: ptr.To[int32](1), LeaderElection: ptr.To(false)}
	})
	updateCluster(t, b, func(s *v1.StorageClusterSpec) { s.CSIController = v1.CSIControllerSpec{} })
	scaled("one replica, electing for the cluster that did not turn it off", 1, true)
	budgeted("no budget for one replica", false)

	updateCluster(t, b, func(s *v1.StorageClusterSpec) { s.CSIController.LeaderElection = ptr.To(false) })
	scaled("one replica, no election", 1, false)

	// As the operator's role: make the budget, then remove it.
	r := reconcilerOn(operatorClient(t))
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(a)}
	for _, replicas := range []int32{2, 1} {
		updateCluster(t, a, func(s *v1.StorageClusterSpec) {
			s.CSIController = v1.CSIControllerSpec{Replicas: ptr.To(replicas)}
		})
		eventually(t, "a reconcile as the operator's role keeps the budget", func(ctx context.Context) (bool, error) {
			if _, err := r.Reconcile(ctx, req); err != nil {
				return false, err
			}
			err := env.Client.Get(ctx, client.ObjectKeyFromObject(pdb), &policyv1.PodDisruptionBudget{})
			return (replicas > 1) == (err == nil), client.IgnoreNotFound(err)
		})
	}
	if err := env.Client.Get(testCtx(t), client.ObjectKeyFromObject(pdb), pdb); !apierrors.IsNotFound(err) {
		t.Errorf("budget after scaling back to one: %v", err)
	}
}
