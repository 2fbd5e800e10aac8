package storagecluster

import (
	"context"
	"errors"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// NodeWidePods selects the pods of the node-wide set, of any holder or
// mover, and of share managers: what must be gone before berth's service
// accounts are.
func NodeWidePods() labels.Selector {
	return podsOf(componentAgent, componentKeeper, componentController, componentMover, componentHolder, "share-manager")
}

// CSIControllerPods selects the CSI controller's pods.
func CSIControllerPods() labels.Selector { return podsOf(componentController) }

func podsOf(components ...string) labels.Selector {
	name, _ := labels.NewRequirement(labelName, selection.Equals, []string{"berth"})
	comp, _ := labels.NewRequirement(labelComponent, selection.In, components)
	return labels.NewSelector().Add(*name, *comp)
}

// RemoveCSIController deletes the CSI controller Deployment, when the
// operator made it: an uninstall removes it first, so that no volume is
// made while the rest goes. It returns what it deleted, as kind/name.
func RemoveCSIController(ctx context.Context, c client.Client, namespace string) ([]string, error) {
	dep := &appsv1.Deployment{}
	switch err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ObjectName(componentController)}, dep); {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("get the CSI controller Deployment: %w", err)
	case dep.Labels[labelManagedBy] != managedBy:
		return nil, nil
	}
	err := c.Delete(ctx, dep, client.PropagationPolicy(metav1.DeletePropagationBackground))
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("delete the CSI controller Deployment: %w", err)
	}
	return []string{"Deployment/" + dep.Name}, nil
}

// RemoveNodeWide deletes what the operator deployed in namespace and owns
// alone (its label app.kubernetes.io/managed-by=berth-operator): the agent,
// keeper and mover DaemonSets, the CSI controller Deployment, their
// Services and budget, and the CSIDriver. It is the last step of an
// uninstall: the caller has stopped the operator (which would deploy the
// set again) and made sure that no StorageCluster and no Volume is left,
// since the keeper holds every userspace volume's connection. Objects
// already gone are no error. It returns what it deleted, as kind/name.
func RemoveNodeWide(ctx context.Context, c client.Client, namespace string) ([]string, error) {
	mine := client.MatchingLabels{labelManagedBy: managedBy}
	var removed []string
	var errs []error
	del := func(kind string, obj client.Object) {
		err := c.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground))
		switch {
		case err == nil:
			removed = append(removed, kind+"/"+obj.GetName())
		case !apierrors.IsNotFound(err):
			errs = append(errs, fmt.Errorf("delete %s %s: %w", kind, obj.GetName(), err))
		}
	}
	lists := []struct {
		kind string
		list client.ObjectList
		each func(client.ObjectList) []client.Object
	}{
		{"DaemonSet", &appsv1.DaemonSetList{}, func(l client.ObjectList) []client.Object {
			return items(l.(*appsv1.DaemonSetList).Items)
		}},
		{"Deployment", &appsv1.DeploymentList{}, func(l client.ObjectList) []client.Object {
			return items(l.(*appsv1.DeploymentList).Items)
		}},
		{"Service", &corev1.ServiceList{}, func(l client.ObjectList) []client.Object {
			return items(l.(*corev1.ServiceList).Items)
		}},
		{"PodDisruptionBudget", &policyv1.PodDisruptionBudgetList{}, func(l client.ObjectList) []client.Object {
			return items(l.(*policyv1.PodDisruptionBudgetList).Items)
		}},
	}
	for _, l := range lists {
		if err := c.List(ctx, l.list, client.InNamespace(namespace), mine); err != nil {
			errs = append(errs, fmt.Errorf("list %ss in %s: %w", l.kind, namespace, err))
			continue
		}
		for _, obj := range l.each(l.list) {
			del(l.kind, obj)
		}
	}
	// The CSIDriver is cluster-wide and one: berth's only when labelled so.
	drv := &storagev1.CSIDriver{}
	switch err := c.Get(ctx, client.ObjectKey{Name: v1.DriverName}, drv); {
	case apierrors.IsNotFound(err):
	case err != nil:
		errs = append(errs, fmt.Errorf("get CSIDriver %s: %w", v1.DriverName, err))
	case drv.Labels[labelManagedBy] == managedBy:
		del("CSIDriver", drv)
	}
	return removed, errors.Join(errs...)
}

// items turns a typed item slice into objects.
func items[T any, P interface {
	*T
	client.Object
}](in []T) []client.Object {
	out := make([]client.Object, 0, len(in))
	for i := range in {
		out = append(out, P(&in[i]))
	}
	return out
}
