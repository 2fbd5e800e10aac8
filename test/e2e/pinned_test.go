//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Scenario (two nodes, local backend): node A is lost (kubelet, containerd
// and its pods' processes stopped) and tainted out-of-service. The pod of a
// volume on node A is recreated without a node: it cannot move (the image
// lives on node A), and berth says so, naming node A, on the waiting pod
// and in the Volume's NodeAvailable condition. Node A back and the taint
// lifted: the pod runs there with its data, the condition turns True, and
// the old pod's hold on node A is gone.
func testLocalVolumeOnLostNode(t *testing.T) {
	s := newScenario(t, 12*time.Minute)
	nodes := s.env.twoNodes(t)
	// Node A is one that runs no operator: the operator tells.
	nodeA := nodes[len(nodes)-1]
	ops, err := s.cs.CoreV1().Pods(berthNamespace).List(s.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=operator"})
	if err == nil && len(ops.Items) > 0 && ops.Items[0].Spec.NodeName == nodeA {
		nodeA = nodes[0]
	}
	s.node = nodeA
	s.pvc("pinned", "berth", "32Mi", corev1.ReadWriteOnce, false)
	pv := s.boundPV("pinned")
	s.pod("holder", "echo hello > /data/f && exec sleep 3600", claimSource("pinned"), false)
	s.running("holder")

	s.stopNode(nodeA)
	waitNodeReady(s.ctx, t, s.cs, nodeA, false)
	s.taintOutOfService(nodeA)
	zero := int64(0)
	if err := s.cs.CoreV1().Pods(s.ns).Delete(s.ctx, "holder", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	s.node = "" // the replacement goes wherever the scheduler can put it
	mover := func() { s.pod("mover", "cat /data/f && exec sleep 3600", claimSource("pinned"), false) }
	mover()

	// berth's Event on the waiting pod names node A.
	s.waitEvents(s.ns, "Pod", "mover", 3*time.Minute, "VolumePinnedToLostNode", nodeA)
	volume := pv.Spec.CSI.VolumeHandle
	cond := func() string {
		out, _ := s.kubectl("get", "volumes.berth.io", volume, "-o",
			`jsonpath={.status.conditions[?(@.type=="NodeAvailable")].status}/{.status.conditions[?(@.type=="NodeAvailable")].reason}`)
		return strings.TrimSpace(out)
	}
	if c := cond(); c != "False/NodeOutOfService" {
		t.Errorf("Volume %s NodeAvailable %q, want False/NodeOutOfService", volume, c)
	}

	if err := s.env.NodeAction(s.ctx, nodeA, "start"); err != nil {
		t.Fatal(err)
	}
	waitNodeReady(s.ctx, t, s.cs, nodeA, true)
	if out, err := s.kubectl("taint", "node", nodeA, corev1.TaintNodeOutOfService+"-"); err != nil {
		t.Fatalf("untaint: %v: %s", err, out)
	}
	// Seen once in CI: the waiting pod bound to node A as the taint went,
	// then gone within a second, no berth event on it. Most likely
	// Kubernetes' taint eviction, reading the node from its own informer,
	// still saw the NoExecute taint the scheduler had seen go. A user's
	// controller would make the pod again; the test does so, once.
	p := s.runningOrRemade("mover", mover)
	if p.Spec.NodeName != nodeA {
		t.Errorf("mover runs on %s, want %s (where its volume lives)", p.Spec.NodeName, nodeA)
	}
	if out, err := s.kubectl("-n", s.ns, "logs", "mover"); err != nil || strings.TrimSpace(out) != "hello" {
		t.Errorf("mover read %q (%v), want the data written before the loss", out, err)
	}
	s.waitFor("NodeAvailable True again", 2*time.Minute, func(context.Context) (bool, error) {
		return cond() == "True/NodeInService", nil
	})
	s.waitFor("the old pod's hold gone from the Attachment", 3*time.Minute, func(context.Context) (bool, error) {
		out, err := s.kubectl("get", "attachments.berth.io", volume, "-o", "jsonpath={.spec.holders}")
		return err == nil && !strings.Contains(out, "/holder") && strings.Contains(out, "/mover"), nil
	})
}
