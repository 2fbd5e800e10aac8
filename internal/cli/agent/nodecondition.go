package agent

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// FlexvolumeCondition is the agent's condition on its Node: True once the
// Flexvolume driver is installed and its init reached the agent, False
// (reason InstallFailed or InitFailed) while it cannot be. An agent told
// to install no driver removes it. The agent's admission policy lets it
// write this condition of its own Node and nothing else there.
const FlexvolumeCondition corev1.NodeConditionType = "BerthFlexvolumeReady"

// The reasons of FlexvolumeCondition.
const (
	reasonFlexInstalled     = "Installed"
	reasonFlexInstallFailed = "InstallFailed"
	reasonFlexInitFailed    = "InitFailed"
)

// +kubebuilder:rbac:groups="",resources=nodes/status,verbs=patch

// NodeCondition writes one condition type on a Node's status.
type NodeCondition struct {
	// Client reads uncached: the agent may get single Nodes, not list them.
	Client client.Client
	Node   string
	Type   corev1.NodeConditionType
}

// Set writes want (its type is n's) unless the Node says the same already,
// keeping the transition time while the status stays; nil removes it.
// Only the condition is patched: kubelet writes the rest of the status.
func (n NodeCondition) Set(ctx context.Context, want *corev1.NodeCondition) error {
	var node corev1.Node
	if err := n.Client.Get(ctx, client.ObjectKey{Name: n.Node}, &node); err != nil {
		return fmt.Errorf("get node %s: %w", n.Node, err)
	}
	var cur *corev1.NodeCondition
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == n.Type {
			cur = &node.Status.Conditions[i]
		}
	}
	var item any
	switch {
	case want == nil && cur == nil:
		return nil
	case want == nil:
		item = map[string]any{"type": n.Type, "$patch": "delete"}
	case cur != nil && cur.Status == want.Status && cur.Reason == want.Reason && cur.Message == want.Message:
		return nil
	default:
		c := *want
		c.Type = n.Type
		c.LastHeartbeatTime = metav1.Now()
		c.LastTransitionTime = c.LastHeartbeatTime
		if cur != nil && cur.Status == c.Status {
			c.LastTransitionTime = cur.LastTransitionTime
		}
		item = c
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []any{item}}})
	if err != nil {
		return err
	}
	if err := n.Client.Status().Patch(ctx, &node, client.RawPatch(types.StrategicMergePatchType, patch)); err != nil {
		return fmt.Errorf("patch condition %s of node %s: %w", n.Type, n.Node, err)
	}
	return nil
}
