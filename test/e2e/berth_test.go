//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// berthNamespace holds the driver pods `berth dev up` installs.
const berthNamespace = "berth-system"

// Labels the operator sets on the pods it deploys.
const (
	agentPods      = "app.kubernetes.io/name=berth,app.kubernetes.io/component=agent"
	controllerPods = "app.kubernetes.io/name=berth,app.kubernetes.io/component=csi-controller"
)

// selectedNodeAnnotation is where the scheduler asks a WaitForFirstConsumer
// claim to be provisioned.
const selectedNodeAnnotation = "volume.kubernetes.io/selected-node"

// hostnameLabel names a node (kubelet sets it to its --hostname-override).
const hostnameLabel = "kubernetes.io/hostname"

// scenario is one berth e2e test: its cluster, client and namespace.
type scenario struct {
	t   *testing.T
	ctx context.Context
	env Env
	cs  kubernetes.Interface
	ns  string
	// node is where the scenario's claims and pods go (the first node).
	node string
	// dumped is set once dump ran: a cleanup that changes what it shows
	// (a StorageCluster's deletion detaches its volumes) dumps first.
	dumped bool
}

// newScenario skips without a cluster or without berth installed, makes a
// namespace that is removed at the end, and dumps events and the driver's
// logs when the test fails.
func newScenario(t *testing.T, timeout time.Duration) *scenario {
	t.Helper()
	env, cs := needCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	if _, err := cs.StorageV1().CSIDrivers().Get(ctx, "berth.io", metav1.GetOptions{}); err != nil {
		if os.Getenv("BERTH_E2E_ENV") != "" {
			t.Fatalf("berth is not installed in the cluster of BERTH_E2E_ENV: %v", err)
		}
		t.Skipf("berth is not installed (%v): run `berth dev up` or make e2e", err)
	}
	s := &scenario{t: t, ctx: ctx, env: env, cs: cs, node: env.NodeName}
	s.ns = testNamespace(ctx, t, cs)
	t.Cleanup(func() {
		if t.Failed() {
			s.dump()
		}
	})
	return s
}

// kubectl runs the cluster's kubectl and returns its combined output.
func (s *scenario) kubectl(args ...string) (string, error) { return s.kubectlIn("", args...) }

// kubectlIn is kubectl with stdin.
func (s *scenario) kubectlIn(stdin string, args ...string) (string, error) {
	cmd := exec.CommandContext(s.ctx, s.env.Vars["KUBECTL"], args...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+s.env.Kubeconfig)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// exec runs a shell script in the pod's first container.
func (s *scenario) exec(pod, script string) (string, error) {
	return s.kubectl("-n", s.ns, "exec", pod, "--", "sh", "-c", script)
}

// dump prints what explains a failure: the nodes' readiness and each VM
// node's console first (one line each leads: CI shows only the first line
// of an entry), then events, the driver's pods and logs.
func (s *scenario) dump() {
	if s.dumped {
		return
	}
	s.dumped = true
	s.t.Logf("nodes: %s", s.nodesReady())
	s.logConsoles()
	for _, args := range [][]string{
		{"get", "events", "-A", "--sort-by=.lastTimestamp"},
		{"get", "pods,pvc,pv", "-A", "-o", "wide"},
		{"get", "volumes.berth.io,attachments.berth.io", "-o", "wide"},
		{"get", "storageclusters", "-o", "wide"},
		{"-n", berthNamespace, "logs", "--tail=60", "-l", agentPods, "--all-containers"},
		{"-n", berthNamespace, "logs", "--tail=60", "-l", controllerPods, "--all-containers"},
		// A share manager replaced meanwhile takes its log along: this
		// is the last one's, with its Lease.
		{"-n", berthNamespace, "logs", "--tail=60", "-l", "app.kubernetes.io/component=share-manager", "--all-containers", "--prefix"},
		{"-n", berthNamespace, "get", "leases", "-o",
			"custom-columns=NAME:.metadata.name,HOLDER:.spec.holderIdentity,ACQUIRED:.spec.acquireTime,RENEWED:.spec.renewTime,TRANSITIONS:.spec.leaseTransitions"},
	} {
		s.logKubectl(args...)
	}
}

// needBerthImage skips the test when the cluster has no berth image (the
// share manager and the probe pods run it).
func (s *scenario) needBerthImage() {
	s.t.Helper()
	if s.env.BerthImage == "" {
		s.t.Skip("no berth image: run up.sh with BERTH_E2E_BERTH_BINARY=bin/berth (make build)")
	}
}

// logKubectl logs what kubectl says to args.
func (s *scenario) logKubectl(args ...string) {
	out, err := s.kubectl(args...)
	s.t.Logf("$ kubectl %s\n%s%v", strings.Join(args, " "), out, errOrEmpty(err))
}

func errOrEmpty(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// pvc creates a claim of class with size and mode.
func (s *scenario) pvc(name, class, size string, access corev1.PersistentVolumeAccessMode, block bool) {
	s.t.Helper()
	mode := corev1.PersistentVolumeFilesystem
	if block {
		mode = corev1.PersistentVolumeBlock
	}
	c := &corev1.PersistentVolumeClaim{
		// berth's classes bind on first consumer; the test picks the node
		// as the scheduler would, so that the PV exists before any pod
		// (the Flexvolume pod names its handle).
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{selectedNodeAnnotation: s.node}},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &class, AccessModes: []corev1.PersistentVolumeAccessMode{access}, VolumeMode: &mode,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
		},
	}
	if _, err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Create(s.ctx, c, metav1.CreateOptions{}); err != nil {
		s.t.Fatalf("create PVC %s: %v", name, err)
	}
}

// boundPV waits for the claim to be bound and returns its PV.
func (s *scenario) boundPV(claim string) *corev1.PersistentVolume {
	s.t.Helper()
	var pvName string
	s.waitFor("PVC "+claim+" bound", 2*time.Minute, func(ctx context.Context) (bool, error) {
		c, err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, claim, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pvName = c.Spec.VolumeName
		return c.Status.Phase == corev1.ClaimBound, nil
	})
	pv, err := s.cs.CoreV1().PersistentVolumes().Get(s.ctx, pvName, metav1.GetOptions{})
	if err != nil {
		s.t.Fatalf("get PV %s: %v", pvName, err)
	}
	return pv
}

// pod creates a busybox pod running script with volume at /data (or, for
// a block claim, the device /dev/xvda).
func (s *scenario) pod(name, script string, vol corev1.VolumeSource, block bool) *corev1.Pod {
	s.t.Helper()
	return s.podWith(name, script, vol, block, nil)
}

// podWith is pod with the spec changed by edit (nil: unchanged) before it
// is created.
func (s *scenario) podWith(name, script string, vol corev1.VolumeSource, block bool, edit func(*corev1.Pod)) *corev1.Pod {
	s.t.Helper()
	c := corev1.Container{
		Name: "c", Image: s.env.BusyboxImage, ImagePullPolicy: corev1.PullNever,
		Command: []string{"sh", "-c", script},
	}
	if block {
		c.VolumeDevices = []corev1.VolumeDevice{{Name: "data", DevicePath: "/dev/xvda"}}
	} else {
		c.VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	}
	// /state outlives the container (the writers keep their log there).
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "state", MountPath: "/state"})
	grace := int64(1)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{c}, TerminationGracePeriodSeconds: &grace,
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: vol},
				{Name: "state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		},
	}
	if s.node != "" {
		// On the node where the scenario's claims live (the local backend
		// keeps a volume on its node); "" leaves it to the scheduler.
		p.Spec.NodeSelector = map[string]string{hostnameLabel: s.node}
	}
	if edit != nil {
		edit(p)
	}
	p, err := s.cs.CoreV1().Pods(s.ns).Create(s.ctx, p, metav1.CreateOptions{})
	if err != nil {
		s.t.Fatalf("create pod %s: %v", name, err)
	}
	return p
}

func claimSource(claim string) corev1.VolumeSource {
	return corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}
}

// running waits for the pod to run and returns it.
func (s *scenario) running(name string) *corev1.Pod {
	s.t.Helper()
	return s.runningOrRemade(name, nil)
}

// runningOrRemade is running, but a pod found gone is made again once by
// remake (nil: a pod gone fails the wait).
func (s *scenario) runningOrRemade(name string, remake func()) *corev1.Pod {
	s.t.Helper()
	var p *corev1.Pod
	s.waitFor("pod "+name+" Running", 3*time.Minute, func(ctx context.Context) (bool, error) {
		var err error
		p, err = s.cs.CoreV1().Pods(s.ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && remake != nil {
			s.t.Logf("pod %s is gone: making it again", name)
			remake()
			remake = nil
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			return false, fmt.Errorf("pod %s ended: %s", name, p.Status.Phase)
		}
		return p.Status.Phase == corev1.PodRunning, nil
	})
	return p
}

// deletePod deletes the pod and waits until it is gone.
func (s *scenario) deletePod(name string) {
	s.t.Helper()
	if err := s.cs.CoreV1().Pods(s.ns).Delete(s.ctx, name, metav1.DeleteOptions{}); err != nil {
		s.t.Fatalf("delete pod %s: %v", name, err)
	}
	s.podGone(name)
}

// podGone waits until pod name (deleted already) is gone.
func (s *scenario) podGone(name string) {
	s.t.Helper()
	s.waitFor("pod "+name+" gone", 2*time.Minute, func(ctx context.Context) (bool, error) {
		_, err := s.cs.CoreV1().Pods(s.ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

// waitFor polls cond until it holds; an error from cond ends the wait,
// but for a passing one of the API server's (tolerant).
func (s *scenario) waitFor(what string, timeout time.Duration, cond func(ctx context.Context) (bool, error)) {
	s.t.Helper()
	s.waitForSaying(what, timeout, cond, nil)
}

// waitForSaying is waitFor whose failure also says what seen tells: the
// last state cond saw, so that the one line that fails names it.
func (s *scenario) waitForSaying(what string, timeout time.Duration, cond func(ctx context.Context) (bool, error), seen func() string) {
	s.t.Helper()
	start := time.Now()
	if err := wait.PollUntilContextTimeout(s.ctx, 250*time.Millisecond, timeout, true, tolerant(s.t, cond)); err != nil {
		last := ""
		if seen != nil {
			last = "; last seen: " + seen()
		}
		s.t.Fatalf("wait for %s: %v%s", what, err, last)
	}
	s.t.Logf("%s after %v", what, time.Since(start).Round(10*time.Millisecond))
}

// tolerant is cond with the API server's passing errors (a timeout, a
// throttle, a dropped connection on the busy 2-core machine) logged and
// polled again, not ending the wait: the poll's own timeout still bounds
// one that does not pass.
func tolerant(t *testing.T, cond func(ctx context.Context) (bool, error)) func(ctx context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		if err != nil && ctx.Err() == nil && passing(err) {
			t.Logf("polling on after a passing error: %v", err)
			return false, nil
		}
		return ok, err
	}
}

func passing(err error) bool {
	return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) ||
		utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err)
}

// settles polls read until it says ok or timeout passes, and returns what
// it saw last: for a check whose state can move for a moment, where a
// single read would fail on the moment.
func (s *scenario) settles(timeout time.Duration, read func() (seen string, ok bool)) (string, bool) {
	var seen string
	err := wait.PollUntilContextTimeout(s.ctx, 250*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		var ok bool
		seen, ok = read()
		return ok, nil
	})
	return seen, err == nil
}

// nodeMounts lists the mount points of the scenario's node that contain any
// of subs.
func (s *scenario) nodeMounts(subs ...string) []string {
	s.t.Helper()
	m, err := s.env.NodeMounts(s.ctx, s.node, subs...)
	if err != nil {
		s.t.Fatal(err)
	}
	return m
}

// clusterEvents returns the messages of a cluster-scoped object's events
// (recorded in the default namespace).
func (s *scenario) clusterEvents(kind, name string) []string { return s.eventsIn("", kind, name) }

// events returns the messages of the object's events.
func (s *scenario) events(kind, name string) []string { return s.eventsIn(s.ns, kind, name) }

// eventsIn returns the messages of the events of an object in namespace ns
// ("" for every namespace: a cluster-scoped object's).
func (s *scenario) eventsIn(ns, kind, name string) []string {
	list, err := s.cs.CoreV1().Events(ns).List(s.ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.kind=" + kind + ",involvedObject.name=" + name,
	})
	if err != nil {
		return []string{err.Error()}
	}
	var msgs []string
	for _, e := range list.Items {
		msgs = append(msgs, e.Reason+": "+e.Message)
	}
	return msgs
}

// waitEvents waits until the events of an object in namespace ns ("" for a
// cluster-scoped object) name every one of want, logs and returns them.
func (s *scenario) waitEvents(ns, kind, name string, timeout time.Duration, want ...string) []string {
	s.t.Helper()
	var msgs []string
	s.waitFor(fmt.Sprintf("%s %s's events naming %q", kind, name, want), timeout, func(context.Context) (bool, error) {
		msgs = s.eventsIn(ns, kind, name)
		all := strings.Join(msgs, "\n")
		for _, w := range want {
			if !strings.Contains(all, w) {
				return false, nil
			}
		}
		return true, nil
	})
	s.t.Logf("%s %s's events: %q", kind, name, msgs)
	return msgs
}

// deleteStorageCluster deletes the StorageCluster name and waits until it
// is gone (its finalizer lifted).
func (s *scenario) deleteStorageCluster(name string) {
	s.t.Helper()
	if out, err := s.kubectl("delete", "storagecluster", name, "--wait=false"); err != nil {
		s.t.Fatalf("delete StorageCluster %s: %v: %s", name, err, out)
	}
	s.waitFor("StorageCluster "+name+" gone", 3*time.Minute, func(context.Context) (bool, error) {
		out, err := s.kubectl("get", "storagecluster", name, "--ignore-not-found", "-o", "name")
		return err == nil && strings.TrimSpace(out) == "", nil
	})
}

// appendingWriter is a pod's script that appends a numbered line to
// /data/log every 0.2 s and stops at the first failed write, saying
// WRITE-ERROR.
const appendingWriter = `i=0; while true; do echo $i >> /data/log || { echo WRITE-ERROR $i; exit 1; }; i=$((i+1)); sleep 0.2; done`

// logLines counts the lines of /data/log in pod.
func (s *scenario) logLines(pod string) int {
	s.t.Helper()
	out, err := s.exec(pod, "wc -l < /data/log")
	if err != nil {
		s.t.Fatalf("count lines: %v", err)
	}
	var n int
	_, _ = fmt.Sscan(out, &n)
	return n
}

// writerUnharmed waits until the appendingWriter pod wrote ten more lines
// and checks that it runs without a restart and never failed a write.
func (s *scenario) writerUnharmed(pod, after string, timeout time.Duration) {
	s.t.Helper()
	before := s.logLines(pod)
	s.waitFor(pod+" to go on writing "+after, timeout, func(context.Context) (bool, error) {
		return s.logLines(pod) > before+10, nil
	})
	p, err := s.cs.CoreV1().Pods(s.ns).Get(s.ctx, pod, metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].RestartCount != 0 {
		s.t.Fatalf("%s %s: %+v; want Running without restarts", pod, after, p.Status)
	}
	if logs, _ := s.kubectl("-n", s.ns, "logs", pod); strings.Contains(logs, "WRITE-ERROR") {
		s.t.Fatalf("%s saw a write error %s: %s", pod, after, logs)
	}
}

// createSnapshot makes the VolumeSnapshot name of claim in class.
func (s *scenario) createSnapshot(name, class, claim string) {
	s.t.Helper()
	manifest := fmt.Sprintf(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: %s, namespace: %s}
spec:
  volumeSnapshotClassName: %s
  source: {persistentVolumeClaimName: %s}
`, name, s.ns, class, claim)
	if out, err := s.kubectlIn(manifest, "apply", "-f", "-"); err != nil {
		s.t.Fatalf("create VolumeSnapshot %s: %v: %s", name, err, out)
	}
}
