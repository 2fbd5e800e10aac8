//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// nbdHealCycles is how many times testVMUserspaceNBDHeals kills the VM
// node's agent; BERTH_E2E_NBD_HEAL_CYCLES overrides it.
const nbdHealCycles = 20

// testVMUserspaceNBDHeals: a userspace volume served over the kernel's nbd
// driver (a StorageCluster with userspaceTransport nbd) on a VM node, whose
// stock kernel has nbd. A writer pod writes files, fsyncs each and
// verifies them; the agent pod's processes, its blockdev servers among
// them, are SIGKILLed and the pod replaced, again and again. The kernel
// keeps the nbd device and queues its I/O while the new agent's server
// takes over: no I/O error reaches the writer, and every file it had
// fsync'd reads back with its checksum. The pause of each cycle (between
// the last acknowledged write before the kill and the first after it, on
// the VM's clock) is logged with its p50 and p99.
func testVMUserspaceNBDHeals(t *testing.T) {
	env, _ := needCluster(t)
	vm := env.vmNode(t) // skips before a namespace is made
	s := newScenario(t, 30*time.Minute)
	s.needBerthImage()
	cycles := nbdHealCycles
	if v := os.Getenv("BERTH_E2E_NBD_HEAL_CYCLES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("BERTH_E2E_NBD_HEAL_CYCLES=%q: want a count >= 1", v)
		}
		cycles = n
	}
	s.storageCluster("vm-nbd", "  agent:\n    userspaceTransport: nbd\n")
	s.waitClustersReady(4*time.Minute, "vm-nbd", "berth")
	s.waitFor("the class vm-nbd-userspace", time.Minute, func(ctx context.Context) (bool, error) {
		_, err := s.cs.StorageV1().StorageClasses().Get(ctx, "vm-nbd-userspace", metav1.GetOptions{})
		return err == nil, nil
	})
	s.node = vm // the claim is made for the VM, as the scheduler would
	s.pvc("nbd", "vm-nbd-userspace", "64Mi", corev1.ReadWriteOnce, false)
	vol := s.boundPV("nbd").Spec.CSI.VolumeHandle
	s.podWith("writer", rwxWriterScript, claimSource("nbd"), false, func(p *corev1.Pod) {
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "ME", Value: "writer"}, {Name: "PEERS", Value: "writer"}}
	})
	s.running("writer")
	if m := s.vmMounts(vm, "/dev/nbd"); len(m) == 0 {
		t.Fatalf("volume %s: no nbd device mounted on %s", vol, vm)
	} else {
		t.Logf("nbd mounts on %s: %v", vm, m)
	}
	s.waitAcks("writer", 5)

	var stalls []time.Duration
	for i := 1; i <= cycles; i++ {
		before, _, _ := s.acks("writer")
		old := s.readyAgent("")
		killed := time.Now()
		s.vmKillPod(vm, old)
		s.readyAgent(old.UID)
		s.waitAcksAfter("writer", killed, 2)
		times, _, _ := s.acks("writer")
		stall := maxGap(times[max(len(before)-1, 0):])
		stalls = append(stalls, stall)
		t.Logf("cycle %d: longest pause between two acknowledged writes %s", i, stall.Round(10*time.Millisecond))
	}
	if m := s.vmMounts(vm, "/dev/nbd"); len(m) == 0 {
		t.Errorf("volume %s: no nbd device mounted on %s after the cycles", vol, vm)
	}
	_, n := s.writerChecked("writer")
	_, files, sums := s.acks("writer")
	acked := map[string]string{}
	for i := range files {
		acked[files[i]] = sums[i]
	}
	s.deletePod("writer")
	s.verifyAcked(vm, "nbd", []string{"writer"}, acked)
	p50, p99 := percentile(stalls, 50), percentile(stalls, 99)
	worst := slices.Max(stalls)
	t.Logf("%d heal cycles, %d fsync'd files: pause p50 %s, p99 %s, max %s", cycles, n,
		p50.Round(time.Millisecond), p99.Round(time.Millisecond), worst.Round(time.Millisecond))
	fmt.Printf("NBD_HEAL_RESULT cycles=%d p50=%v p99=%v max=%v\n", cycles,
		p50.Round(time.Millisecond), p99.Round(time.Millisecond), worst.Round(time.Millisecond))
}

// maxGap is the longest time between two consecutive times.
func maxGap(times []time.Time) time.Duration {
	var gap time.Duration
	for i := 1; i < len(times); i++ {
		gap = max(gap, times[i].Sub(times[i-1]))
	}
	return gap
}

// readyAgent waits for a Ready agent pod on the scenario's node other than
// the one with UID not, and returns it.
func (s *scenario) readyAgent(not types.UID) *corev1.Pod {
	s.t.Helper()
	var ready *corev1.Pod
	s.waitFor("an agent Ready on "+s.node, 4*time.Minute, func(ctx context.Context) (bool, error) {
		pods, err := s.agentPodsOnNode(ctx)
		for i := range pods {
			if p := &pods[i]; p.UID != not && p.DeletionTimestamp == nil && podReady(p) {
				ready = p
				return true, nil
			}
		}
		return false, err
	})
	return ready
}

// vmKillPod SIGKILLs every process of a pod on a VM node at once (the pod's
// cgroup.kill, cgroup v2 in the VM), as in a crash, then deletes the pod at
// once so that its controller makes a new one without a restart back-off.
func (s *scenario) vmKillPod(node string, p *corev1.Pod) {
	s.t.Helper()
	script := fmt.Sprintf(`d=$(find /sys/fs/cgroup -type d \( -name 'pod%[1]s' -o -name '*pod%[2]s.slice' \) | head -n1)
[ -n "$d" ] || { echo "no cgroup of pod %[1]s" >&2; exit 1; }
echo 1 >"$d/cgroup.kill"`, p.UID, strings.ReplaceAll(string(p.UID), "-", "_"))
	if out, err := s.vmExec(node, script); err != nil {
		s.t.Fatalf("SIGKILL pod %s on %s: %v: %s", p.Name, node, err, out)
	}
	zero := int64(0)
	err := s.cs.CoreV1().Pods(p.Namespace).Delete(s.ctx, p.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: ptr.To(p.UID)},
	})
	if err != nil {
		s.t.Fatalf("delete pod %s: %v", p.Name, err)
	}
	s.t.Logf("SIGKILLed pod %s's processes on %s and deleted it", p.Name, node)
}
