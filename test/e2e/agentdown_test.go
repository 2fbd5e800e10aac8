//go:build e2e

package e2e

import (
	"context"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// agentDownTaint keeps the agent off a node: its DaemonSet must not
// tolerate it.
const agentDownTaint = "e2e.berth.io/agent-down"

// agentPodsOnNode lists the agent pods on the scenario's node.
func (s *scenario) agentPodsOnNode(ctx context.Context) ([]corev1.Pod, error) {
	list, err := s.cs.CoreV1().Pods(berthNamespace).List(ctx,
		metav1.ListOptions{LabelSelector: agentPods, FieldSelector: "spec.nodeName=" + s.node})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// agentDown takes the agent off the scenario's node: a taint it does not
// tolerate (lifted by agentBack, or when the test ends), its pods deleted.
// What the node runs keeps running, without an agent.
func (s *scenario) agentDown() {
	s.t.Helper()
	s.t.Cleanup(s.untaintAgentDown)
	if out, err := s.kubectl("taint", "node", s.node, agentDownTaint+"=true:NoSchedule"); err != nil {
		s.t.Fatalf("taint: %v: %s", err, out)
	}
	agents, err := s.agentPodsOnNode(s.ctx)
	if err != nil || len(agents) == 0 {
		s.t.Fatalf("agent pods on %s: %v (%d)", s.node, err, len(agents))
	}
	for _, tol := range agents[0].Spec.Tolerations {
		if tol.ToleratesTaint(&corev1.Taint{Key: agentDownTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}) {
			s.t.Fatalf("the agent tolerates %s (%+v): it would come back at once", agentDownTaint, tol)
		}
	}
	for _, p := range agents {
		if err := s.cs.CoreV1().Pods(berthNamespace).Delete(s.ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			s.t.Fatalf("delete agent pod: %v", err)
		}
	}
	s.waitFor("no agent pod on "+s.node, 2*time.Minute, func(ctx context.Context) (bool, error) {
		agents, err := s.agentPodsOnNode(ctx)
		return err == nil && len(agents) == 0, err
	})
}

// agentBack lifts agentDown's taint and waits for an agent pod Ready on the
// scenario's node.
func (s *scenario) agentBack() {
	s.t.Helper()
	s.untaintAgentDown()
	s.waitFor("an agent pod Ready on "+s.node, 2*time.Minute, func(ctx context.Context) (bool, error) {
		agents, err := s.agentPodsOnNode(ctx)
		return err == nil && len(agents) == 1 && podReady(&agents[0]), err
	})
}

func (s *scenario) untaintAgentDown() { _, _ = s.kubectl("taint", "node", s.node, agentDownTaint+"-") }

// deleteClaimAndImage deletes claim (its pods gone) and waits until its PV
// (pv) and the PV's image file are gone.
func (s *scenario) deleteClaimAndImage(claim, pv, image string) {
	s.t.Helper()
	if err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Delete(s.ctx, claim, metav1.DeleteOptions{}); err != nil {
		s.t.Fatal(err)
	}
	s.waitFor("PV "+pv+" and image "+image+" gone", 3*time.Minute, func(ctx context.Context) (bool, error) {
		_, err := s.cs.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{})
		_, serr := os.Stat(image)
		return apierrors.IsNotFound(err) && os.IsNotExist(serr), nil
	})
}

// waitAgentWithout waits until the agent DaemonSet rolled out with no
// argument naming dir (a deleted StorageCluster's data dir).
func (s *scenario) waitAgentWithout(dir string) {
	s.t.Helper()
	s.waitFor("the agent rolled out without "+dir, 4*time.Minute, func(ctx context.Context) (bool, error) {
		ds, err := s.cs.AppsV1().DaemonSets(berthNamespace).Get(ctx, "berth-agent", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		st := ds.Status
		return !strings.Contains(strings.Join(ds.Spec.Template.Spec.Containers[0].Args, " "), dir) &&
			st.ObservedGeneration == ds.Generation && st.UpdatedNumberScheduled == st.DesiredNumberScheduled &&
			st.NumberAvailable == st.DesiredNumberScheduled, nil
	})
}
