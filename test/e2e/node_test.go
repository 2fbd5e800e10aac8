//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Scenario 5: a pod using the Flexvolume driver: kubelet runs the driver
// the agent installed into its volume plugin folder.
func testFlexvolumePod(t *testing.T) {
	s := newScenario(t, 5*time.Minute)
	// The Volume comes from the CSI side; the pod names it in the options.
	s.pvc("flex", "berth", "32Mi", corev1.ReadWriteOnce, false)
	handle := s.boundPV("flex").Spec.CSI.VolumeHandle
	src := corev1.VolumeSource{FlexVolume: &corev1.FlexVolumeSource{
		Driver: "berth.io/berth", FSType: "ext4", Options: map[string]string{"volume": handle},
	}}
	token := fmt.Sprintf("berth-flex-%d", time.Now().UnixNano())
	pod := s.pod("flex", "echo "+token+" > /data/f && sync && exec sleep 3600", src, false)
	s.running(pod.Name)
	got, err := s.exec(pod.Name, "cat /data/f")
	if err != nil || strings.TrimSpace(got) != token {
		t.Fatalf("read back %q (%v), want %q", got, err, token)
	}
	if m := s.nodeMounts(string(pod.UID) + "/volumes/berth.io~berth"); len(m) == 0 {
		t.Fatal("no Flexvolume mount on the node while the pod runs")
	}
	s.deletePod(pod.Name)
	s.waitFor("Flexvolume unmount", time.Minute, func(context.Context) (bool, error) {
		return len(s.nodeMounts(string(pod.UID))) == 0, nil
	})
}

// Scenario 6: a userspace-mounted claim keeps serving its writer while the
// agent pod is deleted and comes back.
func testUserspaceSurvivesAgentRestart(t *testing.T) {
	s := newScenario(t, 6*time.Minute)
	s.pvc("us", "berth-userspace", "64Mi", corev1.ReadWriteOnce, false)
	s.boundPV("us")
	s.pod("writer", appendingWriter, claimSource("us"), false)
	s.waitFor("writer Running", 2*time.Minute, func(ctx context.Context) (bool, error) {
		p, err := s.cs.CoreV1().Pods(s.ns).Get(ctx, "writer", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, err
	})

	// The agent of the writer's node.
	onNode := metav1.ListOptions{LabelSelector: agentPods, FieldSelector: "spec.nodeName=" + s.node}
	agents, err := s.cs.CoreV1().Pods(berthNamespace).List(s.ctx, onNode)
	if err != nil || len(agents.Items) == 0 {
		t.Fatalf("agent pods on %s: %v (%d)", s.node, err, len(agents.Items))
	}
	old := agents.Items[0]
	if err := s.cs.CoreV1().Pods(berthNamespace).Delete(s.ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete agent pod: %v", err)
	}
	s.waitFor("a new agent pod Ready on "+s.node, 2*time.Minute, func(ctx context.Context) (bool, error) {
		list, err := s.cs.CoreV1().Pods(berthNamespace).List(ctx, onNode)
		if err != nil {
			return false, err
		}
		for _, p := range list.Items {
			if p.UID != old.UID && podReady(&p) {
				return true, nil
			}
		}
		return false, nil
	})
	s.writerUnharmed("writer", "after the agent restart", time.Minute)
}

func podReady(p *corev1.Pod) bool { return !conditionTime(p, corev1.PodReady).IsZero() }

// conditionTime is when p's condition typ turned true (zero: it is not).
func conditionTime(p *corev1.Pod, typ corev1.PodConditionType) time.Time {
	for _, c := range p.Status.Conditions {
		if c.Type == typ && c.Status == corev1.ConditionTrue {
			return c.LastTransitionTime.Time
		}
	}
	return time.Time{}
}
