//go:build e2e

package e2e

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// testVMShareOnWorkloadNode: an RWX claim whose image, and so whose share
// manager, live on the VM node where its workload pod runs too. The
// workload's publish waits for the share while the share manager's stage
// of the device runs on the same node's agent: each must go through (under
// one lock the share stayed "starting" for good). Then the writer goes,
// which stops the share, and a reader is started at once, which starts it
// again: the reader's fresh kernel mount reads every file the writer had
// fsync'd, with no I/O error.
//
// The share manager starts on the TCG node, which runs Go at a fraction of
// native speed. Earlier CI runs failed here: its first Lease renewals came
// late (it renewed only once serving; now from the Lease's taking), and its
// exec probes (the berth binary started in the pod) timed out (HTTP now).
// The scenario ran with a 60 s Lease meanwhile; it passes with the default
// 10 s one now (the share served 41 s after the claim, no LeaseExpired).
func testVMShareOnWorkloadNode(t *testing.T) {
	env, _ := needCluster(t)
	vm := env.vmNode(t) // skips before a namespace is made
	s := newScenario(t, 12*time.Minute)
	s.needBerthImage()
	s.node = vm // the image, and so the share manager, go to the VM
	s.pvc("local", "berth", "128Mi", corev1.ReadWriteMany, false)
	vol := s.boundPV("local").Spec.CSI.VolumeHandle
	s.podWith("writer", rwxWriterScript, claimSource("local"), false, func(p *corev1.Pod) {
		p.Spec.NodeSelector = map[string]string{hostnameLabel: vm}
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "ME", Value: "writer"}, {Name: "PEERS", Value: "writer"}}
	})
	start := time.Now()
	sm := s.shareRunning(vol, "")
	t.Logf("share of %s running on %s after %s", vol, sm.Spec.NodeName, time.Since(start).Round(10*time.Millisecond))
	if sm.Spec.NodeName != vm {
		t.Errorf("share manager on %s, want %s (the volume's node)", sm.Spec.NodeName, vm)
	}
	s.running("writer")
	s.waitAcks("writer", 5)
	_, files, sums := s.acks("writer")
	acked := map[string]string{}
	for i := range files {
		acked[files[i]] = sums[i]
	}
	// The writer goes: no workload is left, the share stops; the reader
	// comes at once and starts it again.
	s.deletePod("writer")
	s.verifyAcked(vm, "local", []string{"writer"}, acked)
	// The share stopped on purpose and started again: no failover for
	// that. (A Lease the share manager fails to renew in time on a busy
	// TCG node is a failover of its own, and allowed here.)
	out, err := s.kubectl("-n", berthNamespace, "get", "events", "--field-selector", "reason=PodFailed,involvedObject.name="+vol,
		"-o", "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}")
	if err != nil {
		t.Fatalf("events of share %s: %v", vol, err)
	}
	if strings.Contains(out, "Succeeded") {
		t.Errorf("the share manager told to stop counted as failed:\n%s", out)
	}
}
