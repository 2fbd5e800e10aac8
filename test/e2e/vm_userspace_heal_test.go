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

// testVMUserspaceNBDHeals: a userspace volume served over the kernel's nbd
// driver (a StorageCluster with userspaceTransport nbd) on a VM node, whose
// stock kernel has nbd, healed through 20 agent kills
// (BERTH_E2E_NBD_HEAL_CYCLES).
func testVMUserspaceNBDHeals(t *testing.T) {
	testVMUserspaceHeals(t, vmHeal{transport: "nbd", device: "/dev/nbd", cycles: 20, volumes: 1})
}

// testVMUserspaceUblkHeals: five userspace volumes served over ublk with
// user recovery (Debian 13's kernel has it) on a VM node, healed through
// 5 agent kills in CI (BERTH_E2E_UBLK_HEAL_CYCLES=50 for the full run):
// the kernel keeps each ublk device and queues its I/O, a new server
// recovers it.
func testVMUserspaceUblkHeals(t *testing.T) {
	testVMUserspaceHeals(t, vmHeal{transport: "ublk", device: "/dev/ublkb", cycles: 5, volumes: 5})
}

// vmHeal is one heal scenario on a VM node: the userspace transport, the
// prefix of its block devices, and how many kills of how many volumes.
type vmHeal struct {
	transport, device string
	cycles, volumes   int
}

// testVMUserspaceHeals: userspace volumes served over h.transport on a
// VM node. A writer pod per volume writes files, fsyncs each and verifies
// them; the agent pod's processes, its blockdev servers among them, are
// SIGKILLed and the pod replaced, again and again. The kernel keeps each
// device and queues its I/O while the new agent's server takes over: no
// I/O error reaches a writer, and every file it had fsync'd reads back
// with its checksum. The pause of each cycle (between the last
// acknowledged write before the kill and the first after it, on the VM's
// clock, the worst writer's) is logged with its p50 and p99.
func testVMUserspaceHeals(t *testing.T, h vmHeal) {
	env, _ := needCluster(t)
	vm := env.vmNode(t) // skips before a namespace is made
	s := newScenario(t, 40*time.Minute)
	s.needBerthImage()
	upper := strings.ToUpper(h.transport)
	h.cycles = envCount(t, "BERTH_E2E_"+upper+"_HEAL_CYCLES", h.cycles)
	h.volumes = envCount(t, "BERTH_E2E_"+upper+"_HEAL_VOLUMES", h.volumes)
	cluster := "vm-" + h.transport
	class := cluster + "-userspace"
	s.storageCluster(cluster, "  agent:\n    userspaceTransport: "+h.transport+"\n")
	s.waitClustersReady(4*time.Minute, cluster, "berth")
	s.waitFor("the class "+class, time.Minute, func(ctx context.Context) (bool, error) {
		_, err := s.cs.StorageV1().StorageClasses().Get(ctx, class, metav1.GetOptions{})
		return err == nil, nil
	})
	s.node = vm // the claims are made for the VM, as the scheduler would
	// A writer writes about 4 MiB per cycle on the TCG node: 44 cycles
	// filled a 64Mi claim (ENOSPC), which is no heal failure.
	size := fmt.Sprintf("%dMi", 64+8*h.cycles)
	var writers []string
	for i := 1; i <= h.volumes; i++ {
		w := fmt.Sprintf("%s-%d", h.transport, i)
		writers = append(writers, w)
		s.pvc(w, class, size, corev1.ReadWriteOnce, false)
		s.boundPV(w)
		s.podWith(w, rwxWriterScript, claimSource(w), false, func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "ME", Value: w}, {Name: "PEERS", Value: w}}
		})
	}
	for _, w := range writers {
		s.running(w)
	}
	if m := s.vmMounts(vm, h.device); len(m) < h.volumes {
		t.Fatalf("%d %s devices mounted on %s, want %d: %v", len(m), h.device, vm, h.volumes, m)
	} else {
		t.Logf("%s mounts on %s: %v", h.device, vm, m)
	}
	for _, w := range writers {
		s.waitAcks(w, 5)
	}

	var stalls []time.Duration
	for i := 1; i <= h.cycles; i++ {
		before := map[string]int{}
		for _, w := range writers {
			times, _, _ := s.acks(w)
			before[w] = len(times)
		}
		old := s.readyAgent("")
		killed := time.Now()
		s.vmKillPod(vm, old)
		s.readyAgent(old.UID)
		var stall time.Duration
		for _, w := range writers {
			s.waitAcksAfter(w, killed, 2)
			times, _, _ := s.acks(w)
			stall = max(stall, maxGap(times[max(before[w]-1, 0):]))
		}
		stalls = append(stalls, stall)
		t.Logf("cycle %d: longest pause between two acknowledged writes %s", i, stall.Round(10*time.Millisecond))
	}
	if m := s.vmMounts(vm, h.device); len(m) < h.volumes {
		t.Errorf("%d %s devices mounted on %s after the cycles, want %d: %v", len(m), h.device, vm, h.volumes, m)
	}
	files := 0
	for _, w := range writers {
		_, n := s.writerChecked(w)
		files += n
	}
	// Every writer goes at once (each pod's end takes ~30 s on the TCG
	// node), then each volume is read back.
	acked := map[string]map[string]string{}
	for _, w := range writers {
		_, names, sums := s.acks(w)
		acked[w] = map[string]string{}
		for i := range names {
			acked[w][names[i]] = sums[i]
		}
		if err := s.cs.CoreV1().Pods(s.ns).Delete(s.ctx, w, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete pod %s: %v", w, err)
		}
	}
	for _, w := range writers {
		s.podGone(w)
		s.verifyAcked(vm, w, []string{w}, acked[w])
	}
	p50, p99 := percentile(stalls, 50), percentile(stalls, 99)
	worst := slices.Max(stalls)
	t.Logf("%s: %d heal cycles of %d volumes, %d fsync'd files: pause p50 %s, p99 %s, max %s", h.transport, h.cycles, h.volumes, files,
		p50.Round(time.Millisecond), p99.Round(time.Millisecond), worst.Round(time.Millisecond))
	fmt.Printf("%s_HEAL_RESULT cycles=%d volumes=%d p50=%v p99=%v max=%v\n", upper, h.cycles, h.volumes,
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

// envCount is the count >= 1 in environment variable name, or def when it
// is unset.
func envCount(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a count >= 1", name, v)
	}
	return n
}
