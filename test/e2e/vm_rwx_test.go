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
// measured by the writers' own clock) is logged. Before the kill, the VM
// node hangs for clientFreeze (qemu stopped), past its lease renewal, and
// the writers go on without an error.
func testVMReadWriteManyKernelClient(t *testing.T) {
	env, _ := needCluster(t)
	vm := env.vmNode(t) // skips before a namespace is made
	s := newScenario(t, 12*time.Minute)
	server := s.env.netnsNode(t)
	s.needBerthImage()
	s.node = server // the volume's image, and so its share manager, go there
	s.t.Cleanup(func() {
		if s.t.Failed() {
			s.dumpShare(vm)
		}
	})
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

	// The client node hangs (qemu stopped: a live migration, a host under
	// load) past its lease renewal; the writers go on without an error when
	// it thaws.
	frozen := time.Now()
	if err := s.env.NodeAction(s.ctx, vm, "freeze"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(clientFreeze)
	if err := s.env.NodeAction(s.ctx, vm, "thaw"); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s frozen for %s", vm, time.Since(frozen).Round(10*time.Millisecond))
	for _, w := range writers {
		s.waitAcksAfter(w, frozen, 3)
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

// dumpShare logs what explains a failed share: the VM node's kernel log
// (the NFS client's complaints) and each share manager's log. (ganesha's
// own log stays in the pod: the berth image has no tail or cat.)
func (s *scenario) dumpShare(vm string) {
	if out, err := s.vmExec(vm, "dmesg | tail -n 80"); err == nil {
		s.t.Logf("dmesg of %s:\n%s", vm, out)
	}
	s.logKubectl("-n", berthNamespace, "logs", "--tail=100", "-l", "app.kubernetes.io/component=share-manager", "--all-containers", "--prefix")
}

// clientFreeze is how long the scenario hangs the client node: well past
// the renewal a kernel client makes at two thirds of the lease, within the
// share's NFS lease (share.DefaultLeaseLifetime, 15 s), which is what the
// lease is for.
const clientFreeze = 10 * time.Second

// rwxWriterScript writes 64 KiB files under /data/$ME/<run>, fsyncs each
// (busybox sync FILE is fsync(2)), prints "ack <seconds.fraction> <file>
// <sha256>" once it is durable (the time: the node's uptime, as busybox's
// date has no fractions), and every tenth file verifies the files its
// peers listed. Any failed step prints WRITE-ERROR and ends the container:
// an I/O error reached the application. Every line also goes to
// /state/log (podWith's emptyDir), which outlives the container: a
// container the runtime restarts (a TCG node under load loses a shim now
// and then) writes on in a <run> folder of its own, and writerLog still
// reads what the first run said.
const rwxWriterScript = `set -u
say() { echo "$*"; [ -d /state ] && echo "$*" >>/state/log; return 0; }
d=/data/$ME/$(head -c 16 /dev/urandom | md5sum | cut -c1-8)
mkdir -p $d || { say WRITE-ERROR mkdir $d; exit 1; }
say "run $d"
i=0
while :; do
  i=$((i+1)); f=$d/f$i
  e=$(dd if=/dev/urandom of=$f bs=4k count=16 2>&1) || { say WRITE-ERROR write $f: $e; exit 1; }
  sync $f || { say WRITE-ERROR fsync $f; exit 1; }
  s=$(sha256sum $f | cut -c1-64) || { say WRITE-ERROR read $f; exit 1; }
  echo "$s  $f" >>$d/sums && sync $d/sums || { say WRITE-ERROR sums; exit 1; }
  say "ack $(cut -d' ' -f1 /proc/uptime) $f $s"
  if [ $((i % 10)) = 0 ]; then
    for p in $PEERS; do
      [ "$p" = "$ME" ] && continue
      for l in /data/$p/*/sums; do
        [ -s $l ] || continue
        n=$(($(wc -l <$l) - 1)); [ $n -gt 0 ] || continue
        head -n $n $l | sha256sum -c -s || { say WRITE-ERROR verify $l; exit 1; }
        say "verified $l $n"
      done
    done
  fi
  sleep 0.2
done
`

var ackLine = regexp.MustCompile(`(?m)^ack ([0-9]+)\.([0-9]+) (\S+) ([0-9a-f]{64})$`)

// writerLog is what a writer said: its container's log, or, once the
// runtime restarted the container, /state/log, which holds every run's.
func (s *scenario) writerLog(pod string) string {
	s.t.Helper()
	if p, err := s.cs.CoreV1().Pods(s.ns).Get(s.ctx, pod, metav1.GetOptions{}); err == nil &&
		len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].RestartCount > 0 {
		if out, err := s.kubectl("-n", s.ns, "exec", pod, "--", "cat", "/state/log"); err == nil {
			return out
		}
	}
	logs, err := s.kubectl("-n", s.ns, "logs", pod)
	if err != nil {
		s.t.Fatalf("logs of %s: %v", pod, err)
	}
	return logs
}

// acks are a writer's acknowledged writes, in order.
func (s *scenario) acks(pod string) (times []time.Time, files, sums []string) {
	logs := s.writerLog(pod)
	if i := strings.Index(logs, "WRITE-ERROR"); i >= 0 {
		line, _, _ := strings.Cut(logs[i:], "\n")
		s.t.Fatalf("%s: an I/O error reached the application (%s):\n%s", pod, line, logs)
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

// writerChecked checks that pod runs and that no run of its container
// met an I/O error, and returns the longest pause between two of its
// acknowledged writes and their count. A restart of the container with no
// error in /state/log is the runtime's (a lost shim), and is logged.
func (s *scenario) writerChecked(pod string) (time.Duration, int) {
	s.t.Helper()
	p, err := s.cs.CoreV1().Pods(s.ns).Get(s.ctx, pod, metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) == 0 {
		s.t.Errorf("%s: %s, containers %v; want Running", pod, p.Status.Phase, p.Status.ContainerStatuses)
	} else if c := p.Status.ContainerStatuses[0]; c.RestartCount > 0 {
		s.t.Logf("%s: its container was restarted %d times by the runtime, with no I/O error in any run's log (last state %+v)",
			pod, c.RestartCount, c.LastTerminationState)
	}
	times, _, _ := s.acks(pod) // fails on an I/O error of any run
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
	script := "for w in " + strings.Join(writers, " ") + "; do for l in /data/$w/*/sums; do sha256sum -c -s $l || echo BAD $l; done; done; cat /data/*/*/sums"
	name := "verify-" + claim
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
