package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// CapacityReporter publishes the backend's free bytes as an annotation on
// this node's Node object, where the CSI controller reads it to place new
// volumes and answer GetCapacity.
type CapacityReporter struct {
	Client   client.Client
	Node     string
	Free     func(context.Context) (int64, error)
	Interval time.Duration
	Log      logr.Logger
}

// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch

// Start reports now and then every Interval until ctx ends (manager.Runnable).
func (r *CapacityReporter) Start(ctx context.Context) error {
	interval := r.Interval
	if interval <= 0 {
		interval = 30 * time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := r.Report(ctx); err != nil {
			r.Log.Error(err, "report capacity")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Report publishes the free bytes once.
func (r *CapacityReporter) Report(ctx context.Context) error {
	free, err := r.Free(ctx)
	if err != nil {
		return err
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		v1.CapacityAnnotation: strconv.FormatInt(free, 10),
	}}})
	if err != nil {
		return err
	}
	node := &corev1.Node{}
	node.Name = r.Node
	if err := r.Client.Patch(ctx, node, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("annotate node %s with capacity: %w", r.Node, err)
	}
	return nil
}
