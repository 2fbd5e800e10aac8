package storagecluster

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// +kubebuilder:rbac:groups=berth.io,resources=volumes;attachments,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch

// PendingCleanup returns, sorted, the nodes a deleting StorageCluster still
// waits for. With cleanup policy Retain it waits for none. With Detach it
// waits for every node that holds an Attachment entry for one of the
// cluster's Volumes, unless that node's agent reported the cleanup done
// (status.cleanedNodes) or the Node object is gone (nobody is left to clean).
func PendingCleanup(ctx context.Context, c client.Reader, sc *v1.StorageCluster) ([]string, error) {
	if sc.Spec.CleanupPolicy == v1.CleanupRetain {
		return nil, nil
	}
	vols := &v1.VolumeList{}
	if err := c.List(ctx, vols); err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	holders := map[string]bool{}
	for i := range vols.Items {
		if vols.Items[i].Spec.StorageCluster != sc.Name {
			continue
		}
		att := &v1.Attachment{}
		err := c.Get(ctx, client.ObjectKey{Name: vols.Items[i].Name}, att)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("attachment %s: %w", vols.Items[i].Name, err)
		}
		for _, e := range att.Spec.Attachments {
			holders[e.Node] = true
		}
	}
	var pending []string
	for node := range holders {
		if slices.Contains(sc.Status.CleanedNodes, node) {
			continue
		}
		err := c.Get(ctx, client.ObjectKey{Name: node}, &corev1.Node{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", node, err)
		}
		pending = append(pending, node)
	}
	slices.Sort(pending)
	return pending, nil
}
