//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-io/berth/internal/controller/sharemanager"
)

// testVMReadWriteManyKernelClient: an RWX claim mounted by workload pods
// through the kernel NFS client of a VM node (Debian's stock kernel; these
// machines' own kernel has none). The share manager runs on a netns node
// (the claim's class pins the local volume there); two writer pods on the
// VM node each write files, fsync them, and verify the other's; the probe
// client on the netns node writes and reads through the same Service. The
// share manager's processes are then SIGKILLed: the writers stall (hard
// mount) and go on, no I/O error reaches them, and every file they had
// fsync'd reads back with its checksum. The longest pause between two
// acknowledged writes (an upper bound of the kill-to-first-write time,
// measured by the writers' own clock) is logged.
func testVMReadWriteManyKernelClient(t *testing.T) {
	env, _ := needCluster(t)
	vm := env.vmNode(t) // skips before a namespace is made
	s := newScenario(t, 12*time.Minute)
	server := s.env.netnsNode(t)
	s.needBerthImage()
	s.node = server // the volume's image, and so its share manager, go there
	s.pvc("shared", "berth", "256Mi", corev1.ReadWriteMany, false)
	vol := s.boundPV("shared").Spec.CSI.VolumeHandle

	writers := []string{"writer-a", "writer-b"}
	for _, w := range writers {
		s.podWith(w, rwxWriterScript, claimSource("shared"), false, func(p *corev1.Pod) {
			p.Spec.NodeSelector = map[string]string{hostnameLabel: vm}
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "ME", Value: w}, {Name: "PEERS", Value: strings.Join(writers, " ")}}
		})
	}
	for _, w := range writers {
		s.running(w)
	}
	sm := s.shareRunning(vol, "")
	if sm.Spec.NodeName != server {
		t.Errorf("share manager on %s, want %s (the volume's node)", sm.Spec.NodeName, server)
	}
	for _, m := range s.vmMounts(vm, "nfs") {
		t.Logf("NFS mount on %s: %s", vm, m)
	}
	if len(s.vmMounts(vm, vol)) == 0 {
		t.Errorf("no kernel NFS mount of %s on %s", vol, vm)
	}
	endpoint := sharemanager.Endpoint(berthNamespace, vol)
	first := s.probeOn(server, "probe-1", endpoint, "--keep", "probe")
	sum := regexp.MustCompile(`(?m)^kept probe sha256 ([0-9a-f]{64})$`).FindStringSubmatch(first)
	if sum == nil {
		t.Fatalf("probe printed no kept checksum:\n%s", first)
	}
	for _, w := range writers {
		s.waitAcks(w, 5)
	}

	// SIGKILL of every process of the share-manager pod: ganesha and the
	// share manager die at once, as in a crash.
	killed := time.Now()
	s.killPodProcesses(sm)
	next := s.shareRunning(vol, sm.UID)
	t.Logf("share manager SIGKILLed: a new pod %s on %s running after %s",
		next.Name, next.Spec.NodeName, time.Since(killed).Round(10*time.Millisecond))
	for _, w := range writers {
		s.waitAcksAfter(w, killed, 5)
	}
	after := s.probeOn(server, "probe-2", endpoint, "--verify", "probe="+sum[1], "--timeout", "2m")
	if !strings.Contains(after, "verified probe sha256 "+sum[1]) {
		t.Errorf("the probe did not verify its file after the kill:\n%s", after)
	}
	// The controller asked the nodes to check their mounts; the VM node's
	// agent probed its kernel mounts (remountRequestedAt, for real).
	if out, _ := s.kubectl("get", "volumes.berth.io", vol, "-o", "jsonpath={.status.remountRequestedAt}"); out == "" {
		t.Errorf("volume %s has no remountRequestedAt after the failover", vol)
	}
	s.waitAgentLog(vm, vol, "share mount answers after the failover", 2*time.Minute)

	var worst time.Duration
	acked := map[string]string{}
	for _, w := range writers {
		gap, n := s.writerChecked(w)
		t.Logf("%s: %d fsync'd files, longest pause between two acknowledged writes %s", w, n, gap.Round(10*time.Millisecond))
		worst = max(worst, gap)
		_, files, sums := s.acks(w)
		for i := range files {
			acked[files[i]] = sums[i]
		}
	}
	for _, w := range writers {
		s.deletePod(w)
	}
	// Every file a writer had fsync'd reads back with its checksum.
	s.verifyAcked(vm, "shared", writers, acked)
	fmt.Printf("RWX_KERNEL_KILL_RESULT stall=%v\n", worst.Round(time.Millisecond))
}

// rwxWriterScript writes 64 KiB files under /data/$ME, fsyncs each (busybox
// sync FILE is fsync(2)), prints "ack <seconds.fraction> <file> <sha256>" once
// it is durable (the time: the node's uptime, as busybox's date has no
// fractions), and every tenth file verifies the files its peers listed.
// Any failed step prints WRITE-ERROR and ends the pod: an I/O error reached
// the application.
const rwxWriterScript = `set -u
d=/data/$ME; mkdir -p $d || { echo WRITE-ERROR mkdir; exit 1; }
i=0
while :; do
  i=$((i+1)); f=$d/f$i
  dd if=/dev/urandom of=$f bs=4k count=16 2>/dev/null || { echo WRITE-ERROR write $f; exit 1; }
  sync $f || { echo WRITE-ERROR fsync $f; exit 1; }
  s=$(sha256sum $f | cut -c1-64) || { echo WRITE-ERROR read $f; exit 1; }
  echo "$s  $f" >>$d/sums && sync $d/sums || { echo WRITE-ERROR sums; exit 1; }
  echo "ack $(cut -d' ' -f1 /proc/uptime) $f $s"
  if [ $((i % 10)) = 0 ]; then
    for p in $PEERS; do
      [ "$p" = "$ME" ] || [ ! -s /data/$p/sums ] && continue
      n=$(($(wc -l </data/$p/sums) - 1)); [ $n -gt 0 ] || continue
      head -n $n /data/$p/sums | sha256sum -c -s || { echo WRITE-ERROR verify $p; exit 1; }
      echo "verified $p $n"
    done
  fi
  sleep 0.2
done
`

var ackLine = regexp.MustCompile(`(?m)^ack ([0-9]+)\.([0-9]+) (\S+) ([0-9a-f]{64})$`)

// acks are a writer's acknowledged writes, in order.
func (s *scenario) acks(pod string) (times []time.Time, files, sums []string) {
	logs, err := s.kubectl("-n", s.ns, "logs", pod)
	if err != nil {
		s.t.Fatalf("logs of %s: %v", pod, err)
	}
	if strings.Contains(logs, "WRITE-ERROR") {
		s.t.Fatalf("%s: an I/O error reached the application:\n%s", pod, logs)
	}
	for _, m := range ackLine.FindAllStringSubmatch(logs, -1) {
		sec, _ := strconv.ParseInt(m[1], 10, 64)
		ns, _ := strconv.ParseInt((m[2] + "000000000")[:9], 10, 64)
		times = append(times, time.Unix(sec, ns))
		files = append(files, m[3])
		sums = append(sums, m[4])
	}
	return times, files, sums
}

// waitAcks waits for n acknowledged writes of pod.
func (s *scenario) waitAcks(pod string, n int) {
	s.t.Helper()
	s.waitFor(fmt.Sprintf("%s: %d acknowledged writes", pod, n), 3*time.Minute, func(context.Context) (bool, error) {
		t, _, _ := s.acks(pod)
		return len(t) >= n, nil
	})
}

// waitAcksAfter waits for n more acknowledged writes of pod than it had at
// at (read now: its clock is the VM's, so the count, not the time, tells).
func (s *scenario) waitAcksAfter(pod string, at time.Time, n int) {
	s.t.Helper()
	t0, _, _ := s.acks(pod)
	s.waitFor(fmt.Sprintf("%s: writes acknowledged again after the kill at %s", pod, at.Format(time.TimeOnly)), 4*time.Minute,
		func(context.Context) (bool, error) {
			t, _, _ := s.acks(pod)
			return len(t) >= len(t0)+n, nil
		})
}

// writerChecked checks that pod runs without a restart and returns the
// longest pause between two of its acknowledged writes and their count.
func (s *scenario) writerChecked(pod string) (time.Duration, int) {
	s.t.Helper()
	p, err := s.cs.CoreV1().Pods(s.ns).Get(s.ctx, pod, metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].RestartCount != 0 {
		s.t.Errorf("%s: %s, restarts %v; want Running without restarts", pod, p.Status.Phase, p.Status.ContainerStatuses)
	}
	times, _, _ := s.acks(pod)
	return maxGap(times), len(times)
}

// verifyAcked checks, in a pod on node with claim once the writers are
// gone, each writer's list of the files it wrote (sha256sum -c), and that every file
// acked (file -> checksum) is in those lists with its checksum.
func (s *scenario) verifyAcked(node, claim string, writers []string, acked map[string]string) {
	s.t.Helper()
	if len(acked) == 0 {
		s.t.Fatalf("no acknowledged write to verify")
	}
	script := "for w in " + strings.Join(writers, " ") + "; do sha256sum -c -s /data/$w/sums || echo BAD $w; done; cat /data/*/sums"
	name := "verify-acked"
	s.podWith(name, script, claimSource(claim), false, func(p *corev1.Pod) {
		p.Spec.NodeSelector = map[string]string{hostnameLabel: node}
		p.Spec.RestartPolicy = corev1.RestartPolicyNever
	})
	phase := waitPodDone(s.ctx, s.t, s.cs, s.ns, name)
	out := podLogs(s.ctx, s.t, s.cs, s.ns, name, "c")
	if phase != corev1.PodSucceeded || strings.Contains(out, "BAD") {
		s.t.Fatalf("files differ from their checksums (%s): %.2000s", phase, out)
	}
	listed := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if sum, file, ok := strings.Cut(l, "  "); ok {
			listed[file] = sum
		}
	}
	lost := 0
	for file, sum := range acked {
		if listed[file] != sum {
			lost++
			s.t.Errorf("acknowledged %s (sha256 %s) reads back as %q", file, sum, listed[file])
		}
	}
	s.t.Logf("%d acknowledged files read back with their checksums, %d lost", len(acked)-lost, lost)
}

// killPodProcesses SIGKILLs every process of a pod on a netns node (its
// cgroup on this machine's kernel).
func (s *scenario) killPodProcesses(p *corev1.Pod) {
	s.t.Helper()
	cg, err := podFreezer(p.UID)
	if err != nil {
		s.t.Fatal(err)
	}
	var pids []int
	_ = filepath.WalkDir(cg, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, _ := os.ReadFile(path)
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	if len(pids) == 0 {
		s.t.Fatalf("no processes in %s's cgroup %s", p.Name, cg)
	}
	slices.Sort(pids)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	s.t.Logf("SIGKILLed %s's processes %v", p.Name, pids)
}

// vmExec runs a shell script as root in a VM node (hack/vm/exec.sh).
func (s *scenario) vmExec(node, script string) (string, error) {
	ctx, cancel := context.WithTimeout(s.ctx, 2*time.Minute)
	defer cancel()
	return s.env.vmExec(ctx, node, script)
}

// vmMounts are the VM node's mount table lines that contain sub.
func (s *scenario) vmMounts(node, sub string) []string {
	return s.vmLines(node, "cat /proc/self/mounts", sub)
}

// vmLines are the lines that contain sub of what script prints in a VM
// node.
func (s *scenario) vmLines(node, script, sub string) []string {
	out, err := s.vmExec(node, script)
	if err != nil {
		s.t.Fatalf("%s on %s: %v", script, node, err)
	}
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, sub) {
			lines = append(lines, l)
		}
	}
	return lines
}

// waitAgentLog waits for a line of node's agent that contains want and
// names volume.
func (s *scenario) waitAgentLog(node, volume, want string, timeout time.Duration) {
	s.t.Helper()
	s.waitFor("agent on "+node+" logs "+want+" for "+volume, timeout, func(ctx context.Context) (bool, error) {
		pods, err := s.cs.CoreV1().Pods(berthNamespace).List(ctx, metav1.ListOptions{
			LabelSelector: agentPods, FieldSelector: "spec.nodeName=" + node,
		})
		if err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			logs, err := s.kubectl("-n", berthNamespace, "logs", p.Name, "-c", "agent")
			if err != nil {
				continue // a pod starting; the next poll reads it
			}
			for _, l := range strings.Split(logs, "\n") {
				if strings.Contains(l, want) && strings.Contains(l, volume) {
					return true, nil
				}
			}
		}
		return false, nil
	})
}
