//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/berth-io/berth/internal/cli/dev"
	"github.com/berth-io/berth/internal/controller/sharemanager"
	"github.com/berth-io/berth/internal/testenv"
)

// upgradeWriter is one verifying writer of the upgrade scenario.
type upgradeWriter struct {
	kind, claim, pod string
	// node the writer runs on; the RWX writer is a probe client on the
	// other node than its share manager.
	node string
}

// testUpgradeAndRollback: berth of the previous release (built from its
// commit with its own Makefile and image builder), with verifying writers
// on a kernel volume, a userspace volume, a ceph userspace volume and an
// RWX share (`berth share probe` in a loop: these nodes have no kernel NFS
// client), is upgraded to this tree the way docs/operations.md says: CRDs
// applied, `berth preflight`, `helm upgrade`. Every DaemonSet and
// Deployment of berth is replaced (new pod UIDs, this tree's image and
// digest), the keeper included; the share manager moves to the new image
// at its next start, which the scenario makes (its pod deleted: the
// ordinary failover). Then `helm rollback`, with the same checks. No writer
// sees an I/O error or a restart; every write it had acknowledged (after
// fsync, or an NFS COMMIT) reads back with its checksum. The longest pause
// between two acknowledged writes per volume kind and phase is printed
// (UPGRADE_RESULT). At the end this tree's berth is installed again, with
// the release's values as they were. BERTH_E2E_UPGRADE=0 leaves it out.
func testUpgradeAndRollback(t *testing.T) {
	if os.Getenv("BERTH_E2E_UPGRADE") == "0" {
		t.Skip("BERTH_E2E_UPGRADE=0: the upgrade and rollback scenario is left out")
	}
	if fileWriterScript == rwxWriterScript {
		t.Fatal("fileWriterScript: rwxWriterScript no longer writes bs=4k count=16")
	}
	s := newScenario(t, 25*time.Minute)
	s.needBerthImage()
	other := s.env.Vars["NODE_NAME_2"]
	if other == "" {
		t.Skip("needs two nodes: the RWX probe client runs on the node without the share manager (BERTH_E2E_NODES=2)")
	}
	// The previous release (hack/cluster/release-image.sh names it;
	// BERTH_E2E_UPGRADE_FROM=COMMIT another).
	oldImage, oldChart := s.releaseImage(os.Getenv("BERTH_E2E_UPGRADE_FROM"))
	from := imageTag(oldImage)
	newImage, newChart := s.env.BerthImage, filepath.Join(repoRoot(), "deploy", "berth")
	u := s.newUpgrade()
	t.Logf("upgrade from %s (%s) to this tree (%s), helm %s", from, oldImage, newImage, u.helmBin)

	// This tree's berth is installed again at the end, whatever happened:
	// the next scenario expects it. Cleanups run last first, so this one
	// runs after the writers' and before the namespace goes.
	t.Cleanup(func() { u.restore(newChart, newImage) })

	// The previous release, as its own install would leave it: its CRDs,
	// its chart, its image.
	before := u.workloadPods()
	u.applyCRDs(oldChart)
	u.helm("upgrade", dev.Release, oldChart, "-n", berthNamespace, "-f", u.values, "--set-string", "image.tag="+imageTag(oldImage))
	u.newDigests(before, u.rolledTo(oldImage, uids(before), "the previous release installed"))
	u.clustersReady()

	// The writers.
	var writers []upgradeWriter
	for _, w := range []struct{ kind, class string }{{"kernel", "berth"}, {"userspace", "berth-userspace"}} {
		writers = append(writers, upgradeWriter{kind: w.kind, claim: w.kind, pod: "writer-" + w.kind, node: s.node})
		s.pvc(w.kind, w.class, "128Mi", corev1.ReadWriteOnce, false)
	}
	if ceph := u.cephCluster(); ceph != "" {
		writers = append(writers, upgradeWriter{kind: "ceph-userspace", claim: "ceph", pod: "writer-ceph", node: s.node})
		s.pvc("ceph", ceph+"-userspace", "128Mi", corev1.ReadWriteOnce, false)
	}
	for _, w := range writers {
		s.podWith(w.pod, fileWriterScript, claimSource(w.claim), false, func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "ME", Value: w.pod}, {Name: "PEERS", Value: w.pod}}
		})
	}
	s.pvc("shared", "berth", "64Mi", corev1.ReadWriteMany, false)
	vol := s.boundPV("shared").Spec.CSI.VolumeHandle
	s.keepShareRunning(vol)
	share := s.shareRunning(vol, "")
	endpoint := sharemanager.Endpoint(berthNamespace, vol)
	rwx := upgradeWriter{kind: "rwx", claim: "shared", pod: "writer-rwx", node: other}
	s.shareWriter(rwx.pod, other, endpoint)
	writers = append(writers, rwx)
	for _, w := range writers {
		s.running(w.pod)
		s.waitAcks(w.pod, 5)
	}

	// phase moves berth to image (upgrade or rollback), checks every
	// component and the share manager, and returns each writer's longest
	// pause in the phase.
	phase := func(name, image string, shareMoves bool, move func()) map[string]time.Duration {
		start := uptime(t)
		old := u.workloadPods()
		u.preflight()
		move()
		u.newDigests(old, u.rolledTo(image, uids(old), "after the "+name))
		u.clustersReady()
		share = u.shareOnImage(vol, share, image, shareMoves)
		for _, w := range writers {
			s.waitAcksAfter(w.pod, time.Now(), 5)
		}
		end := uptime(t)
		stalls := map[string]time.Duration{}
		for _, w := range writers {
			_, n := s.writerChecked(w.pod)
			times, _, _ := s.acks(w.pod)
			stalls[w.kind] = gapWithin(times, start, end)
			t.Logf("%s: %s writer %s: %d acknowledged writes so far, longest pause in the %s %s",
				name, w.kind, w.pod, n, name, stalls[w.kind].Round(time.Millisecond))
		}
		t.Logf("%s took %s", name, (end.Sub(start)).Round(time.Second))
		return stalls
	}
	up := phase("upgrade", newImage, true, func() {
		u.applyCRDs(newChart)
		u.helm("upgrade", dev.Release, newChart, "-n", berthNamespace, "-f", u.values)
	})
	down := phase("rollback", oldImage, false, func() {
		u.helm("rollback", dev.Release, "-n", berthNamespace)
	})

	// Every acknowledged write reads back.
	acked := map[string]map[string]string{}
	for _, w := range writers {
		_, files, sums := s.acks(w.pod)
		acked[w.pod] = map[string]string{}
		for i := range files {
			acked[w.pod][files[i]] = sums[i]
		}
		s.deletePod(w.pod)
	}
	total := 0
	for _, w := range writers {
		total += len(acked[w.pod])
		if w.kind == "rwx" {
			s.verifyShareAcked(other, endpoint, acked[w.pod])
			continue
		}
		s.verifyAcked(w.node, w.claim, []string{w.pod}, acked[w.pod])
		s.deletePod("verify-" + w.claim)
	}
	if t.Failed() {
		return
	}
	for _, w := range writers {
		fmt.Printf("UPGRADE_RESULT from=%s kind=%s upgrade_stall=%v rollback_stall=%v acked=%d io_errors=0 lost=0\n",
			from, w.kind, up[w.kind].Round(time.Millisecond), down[w.kind].Round(time.Millisecond), len(acked[w.pod]))
	}
	t.Logf("%d acknowledged writes on %d volumes read back after the upgrade and the rollback", total, len(writers))
}

// fileWriterScript is rwxWriterScript with 4 KiB files: a writer acks a
// few files a second for minutes here.
var fileWriterScript = strings.Replace(rwxWriterScript, "bs=4k count=16", "bs=4k count=1", 1)

// shareWriterScript writes a 4 KiB file through the share with the probe
// client (write, COMMIT, read back and compare), acks it as rwxWriterScript
// does, and goes on; a probe that fails (it retries through a failover for
// up to 5 minutes) prints WRITE-ERROR and ends the pod. The berth image has
// no shell: busybox comes from an init container (/bb, last on PATH).
const shareWriterScript = `set -u
i=0
while :; do
  i=$((i+1)); f=$ME-f$i
  out=$(berth share probe --keep $f --size 4096 --timeout 5m $EP 2>/tmp/err) || { echo "WRITE-ERROR probe $f: $(tail -n 5 /tmp/err)"; exit 1; }
  s=$(echo "$out" | sed -n "s/^kept $f sha256 //p")
  [ -n "$s" ] || { echo "WRITE-ERROR probe $f said: $out"; exit 1; }
  echo "ack $(cut -d' ' -f1 /proc/uptime) $f $s"
  sleep 0.2
done
`

// shareWriter starts a pod of the berth image on node that runs
// shareWriterScript against the share at endpoint.
func (s *scenario) shareWriter(name, node, endpoint string) {
	s.t.Helper()
	grace := int64(1)
	bb := corev1.VolumeMount{Name: "bb", MountPath: "/bb"}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			NodeSelector:                  map[string]string{hostnameLabel: node},
			Volumes:                       []corev1.Volume{{Name: "bb", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			InitContainers: []corev1.Container{{
				Name: "busybox", Image: s.env.BusyboxImage, ImagePullPolicy: corev1.PullNever, VolumeMounts: []corev1.VolumeMount{bb},
				Command: []string{"sh", "-c", "cp /bin/busybox /bb/ && for a in sh sed cut tail sleep cat; do ln -s busybox /bb/$a; done"},
			}},
			Containers: []corev1.Container{{
				Name: "c", Image: s.env.BerthImage, ImagePullPolicy: corev1.PullNever, VolumeMounts: []corev1.VolumeMount{bb},
				Command: []string{"/bb/sh", "-c", shareWriterScript},
				Env: []corev1.EnvVar{{Name: "ME", Value: name}, {Name: "EP", Value: endpoint},
					{Name: "PATH", Value: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/bb"}},
			}},
		},
	}
	if _, err := s.cs.CoreV1().Pods(s.ns).Create(s.ctx, p, metav1.CreateOptions{}); err != nil {
		s.t.Fatalf("create pod %s: %v", name, err)
	}
}

// verifyShareAcked reads every acknowledged file (name -> sha256) back
// through the share with one probe on node.
func (s *scenario) verifyShareAcked(node, endpoint string, acked map[string]string) {
	s.t.Helper()
	if len(acked) == 0 {
		s.t.Fatal("no acknowledged write through the share to verify")
	}
	args := []string{"--size", "4096", "--timeout", "5m"}
	for _, f := range slices.Sorted(maps.Keys(acked)) {
		args = append(args, "--verify", f+"="+acked[f])
	}
	out := s.probeIn2(node, "verify-share", endpoint, args...)
	lost := 0
	for f, sum := range acked {
		if !strings.Contains(out, "verified "+f+" sha256 "+sum+"\n") {
			lost++
		}
	}
	if lost > 0 {
		s.t.Fatalf("%d of %d acknowledged files through the share did not verify", lost, len(acked))
	}
	s.t.Logf("%d acknowledged files through the share read back with their checksums, 0 lost", len(acked))
}

// probeIn2 is probeOn without logging the (long) output.
func (s *scenario) probeIn2(node, name, endpoint string, args ...string) string {
	s.t.Helper()
	start := time.Now()
	out, phase := s.probeIn(s.ns, node, name, endpoint, args...)
	s.t.Logf("probe %s on %s: %s in %s", name, node, phase, time.Since(start).Round(10*time.Millisecond))
	if phase != corev1.PodSucceeded {
		s.t.Fatalf("probe %s: %s: %.3000s", name, phase, out)
	}
	return out + "\n"
}

// gapWithin is the longest time between two consecutive times of which
// the later is after from and the earlier before to.
func gapWithin(times []time.Time, from, to time.Time) time.Duration {
	var gap time.Duration
	for i := 1; i < len(times); i++ {
		if times[i].After(from) && times[i-1].Before(to) {
			gap = max(gap, times[i].Sub(times[i-1]))
		}
	}
	return gap
}

// uptime is this machine's /proc/uptime as the writers' acks carry it (the
// netns nodes share its kernel).
func uptime(t *testing.T) time.Time {
	t.Helper()
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		t.Fatal(err)
	}
	f, _, _ := strings.Cut(string(b), " ")
	sec, frac, _ := strings.Cut(f, ".")
	si, err1 := strconv.ParseInt(sec, 10, 64)
	ns, err2 := strconv.ParseInt((frac + "000000000")[:9], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/uptime %q", b)
	}
	return time.Unix(si, ns)
}

// repoRoot is the checkout this test is in.
func repoRoot() string { return testenv.RepoRoot() }

// imageTag is the tag of an image reference registry/repository:tag.
func imageTag(ref string) string { return ref[strings.LastIndex(ref, ":")+1:] }

// releaseImage builds (once, cached) berth of commit ("": the previous
// release) with hack/cluster/release-image.sh, imports its image into the
// nodes, and returns the image and the commit's chart.
func (s *scenario) releaseImage(commit string) (image, chart string) {
	s.t.Helper()
	start := time.Now()
	args := []string{"--import"}
	if commit != "" {
		args = append(args, commit)
	}
	cmd := exec.CommandContext(s.ctx, filepath.Join(repoRoot(), "hack", "cluster", "release-image.sh"), args...)
	cmd.Env = append(os.Environ(), "BERTH_E2E_DIR="+s.env.Vars["BERTH_E2E_DIR"])
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		s.t.Fatalf("release-image.sh %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	dir := filepath.Dir(lines[len(lines)-1])
	tag, err := os.ReadFile(filepath.Join(dir, "tag"))
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Logf("berth of %s ready in %s: %s", filepath.Base(dir), time.Since(start).Round(time.Second), strings.TrimSpace(stderr.String()))
	return strings.TrimSpace(string(tag)), filepath.Join(dir, "src", "deploy", "berth")
}

// upgrade is the scenario's handle on berth's Helm release.
type upgrade struct {
	s       *scenario
	helmBin string
	// values are the release's values as `berth dev up` set them.
	values string
}

func (s *scenario) newUpgrade() *upgrade {
	s.t.Helper()
	cmd := exec.CommandContext(s.ctx, "make", "-s", "--no-print-directory", "-C", repoRoot(), "helm-path")
	out, err := cmd.Output()
	if err != nil {
		s.t.Fatalf("make helm-path: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	u := &upgrade{s: s, helmBin: strings.TrimSpace(lines[len(lines)-1])}
	vals := u.helm("get", "values", dev.Release, "-n", berthNamespace, "-o", "yaml")
	u.values = filepath.Join(s.t.TempDir(), "values.yaml")
	if err := os.WriteFile(u.values, []byte(vals), 0o600); err != nil {
		s.t.Fatal(err)
	}
	s.t.Logf("release values:\n%s", vals)
	return u
}

// helm runs helm against the cluster and returns its output.
func (u *upgrade) helm(args ...string) string {
	u.s.t.Helper()
	out, err := u.tryHelm(args...)
	if err != nil {
		u.s.t.Fatal(err)
	}
	return out
}

func (u *upgrade) tryHelm(args ...string) (string, error) {
	cmd := exec.CommandContext(u.s.ctx, u.helmBin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+u.s.env.Kubeconfig)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, out)
	}
	if args[0] != "get" {
		u.s.t.Logf("$ helm %s\n%s", strings.Join(args, " "), out)
	}
	return string(out), nil
}

// applyCRDs applies a chart's CRDs as docs/install.md says.
func (u *upgrade) applyCRDs(chart string) {
	u.s.t.Helper()
	if out, err := u.s.kubectl("apply", "--server-side", "--force-conflicts", "-f", filepath.Join(chart, "crds")); err != nil {
		u.s.t.Fatalf("apply the CRDs of %s: %v: %s", chart, err, out)
	}
}

// preflight waits until `berth preflight` in the operator's pod says the
// cluster may be upgraded (docs/operations.md).
func (u *upgrade) preflight() {
	u.s.t.Helper()
	start := time.Now()
	out, ok := u.s.settles(3*time.Minute, func() (string, bool) {
		out, err := u.s.kubectl("-n", berthNamespace, "exec", "deploy/berth-operator", "--", "berth", "preflight")
		return out, err == nil
	})
	if !ok {
		u.s.t.Fatalf("berth preflight did not say ready to upgrade in %s:\n%s", time.Since(start).Round(time.Second), out)
	}
	u.s.t.Logf("$ berth preflight (after %s)\n%s", time.Since(start).Round(time.Second), out)
}

// clustersReady waits for every StorageCluster to be Ready.
func (u *upgrade) clustersReady() {
	u.s.t.Helper()
	out, err := u.s.kubectl("get", "storageclusters", "-o", "jsonpath={.items[*].metadata.name}")
	if err != nil {
		u.s.t.Fatal(err)
	}
	u.s.waitClustersReady(4*time.Minute, strings.Fields(out)...)
}

// cephCluster is the cluster's ceph StorageCluster ("" when there is none,
// said in the log).
func (u *upgrade) cephCluster() string {
	out, err := u.s.kubectl("get", "storageclusters", "-o",
		`jsonpath={range .items[?(@.spec.backend=="ceph")]}{.metadata.name}{"\n"}{end}`)
	if err != nil {
		u.s.t.Fatal(err)
	}
	if f := strings.Fields(out); len(f) > 0 {
		return f[0]
	}
	u.s.t.Log("NOTE: no ceph StorageCluster (hack/e2e.sh adds one unless BERTH_E2E_CEPH=0): the ceph userspace volume is left out")
	return ""
}

// workloadPod is a pod of one of berth's DaemonSets or Deployments.
type workloadPod struct {
	workload, component, node string
	uid                       types.UID
	images, imageIDs          []string
	ready, deleting           bool
}

// workloadPods lists the pods of every DaemonSet and Deployment in berth's
// namespace, with their berth containers' images and digests.
func (u *upgrade) workloadPods() []workloadPod {
	u.s.t.Helper()
	pods, err := u.s.cs.CoreV1().Pods(berthNamespace).List(u.s.ctx, metav1.ListOptions{})
	if err != nil {
		u.s.t.Fatal(err)
	}
	var list []workloadPod
	for _, p := range pods.Items {
		owner := metav1.GetControllerOf(&p)
		if owner == nil || (owner.Kind != "DaemonSet" && owner.Kind != "ReplicaSet") {
			continue // share managers, probes
		}
		w := workloadPod{workload: owner.Kind + "/" + owner.Name, component: p.Labels["app.kubernetes.io/component"],
			node: p.Spec.NodeName, uid: p.UID, ready: podReady(&p), deleting: p.DeletionTimestamp != nil}
		if owner.Kind == "ReplicaSet" {
			w.workload = "Deployment/" + owner.Name[:max(strings.LastIndex(owner.Name, "-"), 0)]
		}
		for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
			if strings.HasPrefix(c.Image, "berth.local/berth:") {
				w.images = append(w.images, c.Image)
			}
		}
		for _, c := range p.Status.ContainerStatuses {
			if strings.HasPrefix(c.Image, "berth.local/berth:") {
				w.imageIDs = append(w.imageIDs, c.ImageID)
			}
		}
		list = append(list, w)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].workload+list[i].node < list[j].workload+list[j].node })
	return list
}

func uids(pods []workloadPod) map[types.UID]bool {
	m := map[types.UID]bool{}
	for _, p := range pods {
		m[p.uid] = true
	}
	return m
}

// notOn are the UIDs of the pods that run a berth image other than image.
func notOn(pods []workloadPod, image string) map[types.UID]bool {
	m := map[types.UID]bool{}
	for _, p := range pods {
		if len(p.images) == 0 || slices.ContainsFunc(p.images, func(im string) bool { return im != image }) {
			m[p.uid] = true
		}
	}
	return m
}

// newDigests checks that no pod of after runs an image digest that a pod
// of before ran: the image changed, not only its tag.
func (u *upgrade) newDigests(before, after []workloadPod) {
	u.s.t.Helper()
	old := map[string]bool{}
	for _, p := range before {
		for _, id := range p.imageIDs {
			old[id] = true
		}
	}
	for _, p := range after {
		for _, id := range p.imageIDs {
			if old[id] {
				u.s.t.Errorf("%s pod %s on %s runs %s, as a pod before did", p.workload, p.uid, p.node, id)
			}
		}
	}
}

// rolledTo waits until every DaemonSet and Deployment of berth has rolled
// out to image: each has all its pods, ready, none left of old (UIDs),
// every berth container on image; and the operator, CSI controller, agent
// and keeper are among them. It logs the pods and checks that their image
// digests differ from the old pods'.
func (u *upgrade) rolledTo(image string, old map[types.UID]bool, what string) []workloadPod {
	u.s.t.Helper()
	want := []string{"operator", "csi-controller", "agent", "keeper"}
	var pods []workloadPod
	var why string
	start := time.Now()
	err := func() error {
		for {
			ok, w := u.rolled(image, old, want)
			why = w
			if ok {
				pods = u.workloadPods()
				return nil
			}
			select {
			case <-u.s.ctx.Done():
				return u.s.ctx.Err()
			case <-time.After(time.Second):
			}
			if time.Since(start) > 6*time.Minute {
				return fmt.Errorf("not rolled out after %s", time.Since(start).Round(time.Second))
			}
		}
	}()
	if err != nil {
		u.s.logKubectl("-n", berthNamespace, "get", "pods,daemonsets,deployments", "-o", "wide")
		u.s.t.Fatalf("%s: berth's workloads on %s: %v: %s", what, image, err, why)
	}
	var lines []string
	for _, p := range pods {
		lines = append(lines, fmt.Sprintf("%s %s on %s: uid %s, %s %s", p.workload, p.component, p.node, p.uid, strings.Join(p.images, ","), strings.Join(p.imageIDs, ",")))
	}
	u.s.t.Logf("%s: every berth pod replaced and on %s after %s:\n%s", what, image, time.Since(start).Round(time.Second), strings.Join(lines, "\n"))
	return pods
}

// rolled tells whether berth's workloads have rolled out to image, and if
// not, why.
func (u *upgrade) rolled(image string, old map[types.UID]bool, want []string) (bool, string) {
	ctx := u.s.ctx
	dss, err := u.s.cs.AppsV1().DaemonSets(berthNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, err.Error()
	}
	for _, d := range dss.Items {
		st := d.Status
		if d.Generation != st.ObservedGeneration || st.UpdatedNumberScheduled != st.DesiredNumberScheduled ||
			st.NumberReady != st.DesiredNumberScheduled || st.CurrentNumberScheduled != st.DesiredNumberScheduled {
			return false, fmt.Sprintf("DaemonSet %s rolling: %+v", d.Name, st)
		}
	}
	deps, err := u.s.cs.AppsV1().Deployments(berthNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, err.Error()
	}
	for _, d := range deps.Items {
		st := d.Status
		replicas := int32(1)
		if d.Spec.Replicas != nil {
			replicas = *d.Spec.Replicas
		}
		if d.Generation != st.ObservedGeneration || st.UpdatedReplicas != replicas || st.ReadyReplicas != replicas || st.Replicas != replicas {
			return false, fmt.Sprintf("Deployment %s rolling: %+v", d.Name, st)
		}
	}
	seen := map[string]bool{}
	for _, p := range u.workloadPods() {
		switch {
		case old[p.uid]:
			return false, fmt.Sprintf("%s pod %s on %s is still there", p.workload, p.uid, p.node)
		case p.deleting || !p.ready:
			return false, fmt.Sprintf("%s pod %s on %s not ready or going", p.workload, p.uid, p.node)
		case len(p.images) == 0:
			return false, fmt.Sprintf("%s pod %s on %s runs no berth image", p.workload, p.uid, p.node)
		}
		for _, im := range p.images {
			if im != image {
				return false, fmt.Sprintf("%s pod %s on %s runs %s", p.workload, p.uid, p.node, im)
			}
		}
		seen[p.component] = true
	}
	for _, c := range want {
		if !seen[c] {
			return false, "no " + c + " pod yet"
		}
	}
	return true, ""
}

// shareOnImage waits until the ShareManager of vol asks for image (the
// new operator moves it) and its pod (pod, running another image) is
// replaced by one on image, and returns the new pod. This tree's operator
// replaces it (moves); the release's does not, so the test deletes it,
// as docs/operations.md tells an operator going back to v0.1.0.
func (u *upgrade) shareOnImage(vol string, pod *corev1.Pod, image string, moves bool) *corev1.Pod {
	s := u.s
	s.t.Helper()
	s.waitFor("ShareManager "+vol+" on "+image, 2*time.Minute, func(context.Context) (bool, error) {
		out, err := s.kubectl("-n", berthNamespace, "get", "sharemanager", vol, "-o", "jsonpath={.spec.image}")
		return err == nil && out == image, nil
	})
	if pod.Spec.Containers[0].Image == image {
		return pod
	}
	if moves {
		s.t.Logf("share-manager pod %s runs %s: the operator moves the share to %s", pod.Name, pod.Spec.Containers[0].Image, image)
	} else {
		s.t.Logf("share-manager pod %s runs %s: deleting it, the share starts again on %s", pod.Name, pod.Spec.Containers[0].Image, image)
		if err := s.cs.CoreV1().Pods(berthNamespace).Delete(s.ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
			s.t.Fatal(err)
		}
	}
	next := s.shareRunning(vol, pod.UID)
	if got := next.Spec.Containers[0].Image; got != image {
		s.t.Fatalf("the share manager started again on %s, want %s", got, image)
	}
	return next
}

// restore installs this tree's berth again, with the release's values,
// and waits for it to roll out: what the next scenario expects.
func (u *upgrade) restore(chart, image string) {
	t := u.s.t
	// The scenario's own time may be up: this gets its own.
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	orig := u.s.ctx
	u.s.ctx = ctx
	defer func() { cancel(); u.s.ctx = orig }()
	if t.Failed() {
		u.s.dump() // as it was, before berth is installed again
	}
	before := u.workloadPods()
	old := notOn(before, image)
	u.applyCRDs(chart)
	if len(before) > 0 && len(old) == 0 {
		t.Logf("berth already runs %s", image)
		return
	}
	if _, err := u.tryHelm("upgrade", dev.Release, chart, "-n", berthNamespace, "-f", u.values); err != nil {
		t.Error(err)
		return
	}
	u.rolledTo(image, old, "this tree's berth installed again")
	u.clustersReady()
}

// TestGapWithin needs no cluster: the pauses that overlap the window
// count, those wholly before or after it do not.
func TestGapWithin(t *testing.T) {
	at := func(s float64) time.Time { return time.Unix(0, int64(s*float64(time.Second))) }
	times := []time.Time{at(0), at(10), at(11), at(14), at(15), at(30)}
	if g := gapWithin(times, at(10.5), at(14.5)); g != 3*time.Second {
		t.Errorf("gap %v, want 3s (11 to 14)", g)
	}
	if g := gapWithin(times, at(9), at(12)); g != 10*time.Second {
		t.Errorf("gap %v, want 10s (0 to 10 ends in the window)", g)
	}
	if g := gapWithin(times, at(20), at(21)); g != 15*time.Second {
		t.Errorf("gap %v, want 15s (15 to 30 spans the window)", g)
	}
}
