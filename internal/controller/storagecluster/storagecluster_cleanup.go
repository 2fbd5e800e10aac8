package storagecluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
)

// +kubebuilder:rbac:groups=berth.io,resources=volumes;attachments,verbs=get;list;watch
// Giving up on a node moves its entries to its stale list.
// +kubebuilder:rbac:groups=berth.io,resources=attachments,verbs=update;delete
// +kubebuilder:rbac:groups=berth.io,resources=nodecleanups,verbs=get;create;update
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch

// DefaultCleanupTimeout applies when spec.cleanupTimeout is unset.
const DefaultCleanupTimeout = 5 * time.Minute

// EventCleanupTimedOut is the Event reason when a deletion stops waiting.
const EventCleanupTimedOut = "CleanupTimedOut"

// giveUp moves the entries that the pending nodes hold on this cluster's
// volumes to those nodes' stale lists (reason ClusterDeleted): each agent
// detaches them when it is back, and the deletion goes on without it.
func (r *Reconciler) giveUp(ctx context.Context, log logr.Logger, sc *v1.StorageCluster, pending []string, timeout time.Duration) error {
	direct := r.Direct
	if direct == nil {
		direct = r.Client
	}
	vols := &v1.VolumeList{}
	if err := direct.List(ctx, vols); err != nil {
		return fmt.Errorf("list volumes: %w", err)
	}
	moved := 0
	for i := range vols.Items {
		if vols.Items[i].Spec.StorageCluster != sc.Name {
			continue
		}
		for _, node := range pending {
			n, err := fence.EvictNode(ctx, direct, r.clock(), fence.Options{Blocklister: r.Blocklister, Events: r.Recorder},
				vols.Items[i].Name, node, v1.ReasonClusterDeleted)
			if err != nil {
				return fmt.Errorf("move node %s's entries of %s to its stale list (the deletion waits; cleanupPolicy Retain deletes without detaching): %w",
					node, vols.Items[i].Name, err)
			}
			moved += n
		}
	}
	msg := fmt.Sprintf("stopped waiting for the agents of nodes %s after %v: their %d entries are on their stale lists, "+
		"and each agent detaches them when it is back", strings.Join(pending, ", "), timeout, moved)
	log.Info("cleanup timed out", "nodes", pending, "timeout", timeout, "entriesMoved", moved)
	if r.Recorder != nil {
		r.Recorder.Event(sc, corev1.EventTypeWarning, EventCleanupTimedOut, msg)
	}
	return nil
}

func (r *Reconciler) clock() clock.Clock {
	if r.Clock == nil {
		return clock.RealClock{}
	}
	return r.Clock
}

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
