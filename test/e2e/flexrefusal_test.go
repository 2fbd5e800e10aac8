//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func flexSource(handle string) corev1.VolumeSource {
	return corev1.VolumeSource{FlexVolume: &corev1.FlexVolumeSource{
		Driver: "berth.io/berth", FSType: "ext4", Options: map[string]string{"volume": handle},
	}}
}

// waitRefused waits until the pod's events show a failed mount with want
// in berth's own words: kubelet parsed the driver's answer (no JSON error).
func (s *scenario) waitRefused(pod, want string) {
	s.t.Helper()
	for _, m := range s.waitEvents(s.ns, "Pod", pod, 3*time.Minute, want) {
		if strings.Contains(m, "invalid character") || strings.Contains(m, "unmarshal") {
			s.t.Errorf("kubelet could not parse the driver's answer: %q", m)
		}
	}
}

// A Flexvolume mount of a volume whose claim is in another namespace is
// refused, and the pod's events carry berth's reason.
func testFlexvolumeRefusedToOtherNamespace(t *testing.T) {
	s := newScenario(t, 6*time.Minute)
	other := testNamespace(s.ctx, t, s.cs)
	mine := s.ns
	s.ns = other
	s.pvc("theirs", "berth", "32Mi", corev1.ReadWriteOnce, false)
	handle := s.boundPV("theirs").Spec.CSI.VolumeHandle
	s.ns = mine
	s.pod("intruder", "exec sleep 3600", flexSource(handle), false)
	s.waitRefused("intruder", "may not use volume "+handle)
	if p, err := s.cs.CoreV1().Pods(s.ns).Get(s.ctx, "intruder", metav1.GetOptions{}); err != nil || p.Status.Phase == corev1.PodRunning {
		t.Fatalf("intruder: %v, phase %v; want it kept from running", err, p.Status.Phase)
	}
}

// A second pod on a ReadWriteOncePod volume through Flexvolume is refused
// with berth's reason while the first keeps it.
func testFlexvolumeRefusedReadWriteOncePod(t *testing.T) {
	s := newScenario(t, 6*time.Minute)
	s.pvc("rwop", "berth", "32Mi", corev1.ReadWriteOncePod, false)
	handle := s.boundPV("rwop").Spec.CSI.VolumeHandle
	if mode, _ := s.kubectl("get", "volumes.berth.io", handle, "-o", "jsonpath={.spec.accessMode}"); mode != "ReadWriteOncePod" {
		t.Fatalf("Volume %s access mode %q, want ReadWriteOncePod (the claim's)", handle, mode)
	}
	s.pod("first", "echo one > /data/f && sync && exec sleep 3600", flexSource(handle), false)
	s.running("first")
	s.pod("second", "exec sleep 3600", flexSource(handle), false)
	s.waitRefused("second", "ReadWriteOncePod allows one pod")
	if got, err := s.exec("first", "cat /data/f"); err != nil || strings.TrimSpace(got) != "one" {
		t.Fatalf("first pod reads %q (%v) after the refusal", got, err)
	}
}

// With the agent down on the node, a Flexvolume mount fails with a clear
// Failure in the pod's events; once the agent is back the mount works.
func testFlexvolumeAgentDown(t *testing.T) {
	s := newScenario(t, 8*time.Minute)
	s.pvc("down", "berth", "32Mi", corev1.ReadWriteOnce, false)
	handle := s.boundPV("down").Spec.CSI.VolumeHandle

	s.agentDown()

	pod := s.podWith("flex", "echo back > /data/f && sync && exec sleep 3600", flexSource(handle), false, func(p *corev1.Pod) {
		p.Spec.Tolerations = []corev1.Toleration{{Key: agentDownTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	})
	s.waitRefused(pod.Name, "agent not reachable")
	all := strings.Join(s.events("Pod", pod.Name), "\n")
	if !strings.Contains(all, "Failure") {
		t.Errorf("pod events %q: no Failure status from the driver", all)
	}

	s.agentBack()
	s.running(pod.Name)
	if got, err := s.exec(pod.Name, "cat /data/f"); err != nil || strings.TrimSpace(got) != "back" {
		t.Fatalf("read back %q (%v)", got, err)
	}
	s.deletePod(pod.Name)
	s.waitFor("Flexvolume unmount", time.Minute, func(context.Context) (bool, error) {
		return len(s.nodeMounts(string(pod.UID))) == 0, nil
	})
}
