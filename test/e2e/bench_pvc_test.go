//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestBenchPVCToRunning is `make bench`'s figure for the whole provisioning
// path (provisioner, CreateVolume, scheduling, stage, publish): the time from
// creating a claim to its pod Running, for BERTH_BENCH_PVCS (default 20)
// claims and pods created at once on one node, per StorageClass, against
// the same pods with an emptyDir (the baseline: what the node takes to start
// a pod without berth). It prints one PVC_RUNNING_RESULT line per class,
// with p99's ratio to the baseline's; hack/bench.sh reports them. Figures
// are reported, never asserted (CI machines are shared).
func TestBenchPVCToRunning(t *testing.T) {
	n := benchRuns(t, "BERTH_BENCH_PVCS", 20)
	var base time.Duration
	for _, class := range []string{emptyDirClass, "berth", "berth-userspace"} {
		t.Run(class, func(t *testing.T) {
			s := newScenario(t, 10*time.Minute)
			// client-go's default rate limit (5/s) would queue the creates,
			// and the figure would measure the client.
			s.cs = s.env.clientWithRate(t, 200)
			took, nodes, ph := s.pvcsToRunning(class, n)
			p50, p99 := percentile(took, 50), percentile(took, 99)
			ratio := "-"
			if class == emptyDirClass {
				base = p99
			} else if base > 0 {
				ratio = fmt.Sprintf("%.2f", float64(p99)/float64(base))
			}
			fmt.Printf("PVC_RUNNING_RESULT class=%s pvcs=%d nodes=%d p50=%v p99=%v max=%v p99_vs_emptydir=%s\n",
				class, n, len(nodes), p50, p99, slices.Max(took), ratio)
			// Where the time goes (the API's condition times have whole
			// seconds): to the pod's scheduling (with WaitForFirstConsumer
			// that includes provisioning), to its sandbox (kubelet mounts
			// the volumes first), to Running.
			fmt.Printf("PVC_RUNNING_PHASES class=%s scheduled_p99=%v volumes_sandbox_p99=%v containers_p99=%v\n",
				class, percentile(ph.scheduled, 99), percentile(ph.sandbox, 99), percentile(ph.containers, 99))
			t.Logf("pods per node: %v", nodes)
		})
	}
}

// emptyDirClass stands for no class: the pods get an emptyDir, no claim.
const emptyDirClass = "emptyDir"

// benchRuns skips a benchmark unless BERTH_E2E_BENCH=1, and returns how
// many runs the environment variable env asks for (def when unset).
func benchRuns(t *testing.T, env string, def int) int {
	t.Helper()
	if os.Getenv("BERTH_E2E_BENCH") != "1" {
		t.Skip("a benchmark: set BERTH_E2E_BENCH=1 (make bench runs it on a two-node cluster)")
	}
	v := os.Getenv(env)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", env, v)
	}
	return n
}

// startPhases are each pod's times from its claim's creation to its
// scheduling, from there to its sandbox ready, and from there to Running.
type startPhases struct{ scheduled, sandbox, containers []time.Duration }

// pvcsToRunning creates n claims of class, each with a pod that mounts it,
// all at once, and returns each pair's time from claim create to pod
// Running, how many pods ran on each node, and the phases of each start.
func (s *scenario) pvcsToRunning(class string, n int) ([]time.Duration, map[string]int, startPhases) {
	s.t.Helper()
	start := make([]time.Time, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start[i] = time.Now()
			errs[i] = s.createClaimAndPod(fmt.Sprintf("b%d", i), class)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			s.t.Fatal(err)
		}
	}
	running, scheduled, sandbox := make([]time.Time, n), make([]time.Time, n), make([]time.Time, n)
	nodes := map[string]int{}
	left := n
	s.waitFor(fmt.Sprintf("%d pods Running", n), 8*time.Minute, func(ctx context.Context) (bool, error) {
		list, err := s.cs.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		now := time.Now()
		for _, p := range list.Items {
			var i int
			if _, err := fmt.Sscanf(p.Name, "b%d", &i); err != nil || i < 0 || i >= n || !running[i].IsZero() {
				continue
			}
			if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
				return false, fmt.Errorf("pod %s ended: %s", p.Name, p.Status.Phase)
			}
			if p.Status.Phase == corev1.PodRunning {
				running[i] = now
				scheduled[i] = conditionTime(&p, corev1.PodScheduled)
				sandbox[i] = conditionTime(&p, corev1.PodReadyToStartContainers)
				nodes[p.Spec.NodeName]++
				left--
			}
		}
		return left == 0, nil
	})
	took := make([]time.Duration, n)
	var ph startPhases
	for i := range n {
		took[i] = running[i].Sub(start[i]).Round(time.Millisecond)
		if scheduled[i].IsZero() || sandbox[i].IsZero() {
			continue
		}
		ph.scheduled = append(ph.scheduled, scheduled[i].Sub(start[i]).Round(time.Second))
		ph.sandbox = append(ph.sandbox, sandbox[i].Sub(scheduled[i]))
		ph.containers = append(ph.containers, running[i].Sub(sandbox[i]).Round(time.Second))
	}
	return took, nodes, ph
}

// createClaimAndPod makes claim name of class and pod name using it, on
// the cluster's first node (class emptyDirClass: the pod alone, with an
// emptyDir).
func (s *scenario) createClaimAndPod(name, class string) error {
	vol := claimSource(name)
	if class == emptyDirClass {
		vol = corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}
	} else if err := s.createClaim(name, class); err != nil {
		return err
	}
	grace := int64(1)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			// All on one node: the figure is one node's pod start.
			NodeSelector: map[string]string{hostnameLabel: s.env.NodeName},
			Containers: []corev1.Container{{
				Name: "c", Image: s.env.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:      []string{"sh", "-c", "exec sleep 3600"},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			TerminationGracePeriodSeconds: &grace,
			Volumes:                       []corev1.Volume{{Name: "data", VolumeSource: vol}},
		},
	}
	if _, err := s.cs.CoreV1().Pods(s.ns).Create(s.ctx, p, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod %s: %w", name, err)
	}
	return nil
}

// createClaim makes claim name of class, bound where the scheduler puts its
// first consumer.
func (s *scenario) createClaim(name, class string) error {
	mode := corev1.PersistentVolumeFilesystem
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &class, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, VolumeMode: &mode,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("32Mi")}},
		},
	}
	if _, err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Create(s.ctx, c, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create PVC %s: %w", name, err)
	}
	return nil
}

// percentile is the nearest-rank percentile q (0-100] of d: with 20 samples
// p99 is the slowest one; of no samples, 0.
func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	sorted := slices.Clone(d)
	slices.Sort(sorted)
	rank := int(math.Ceil(q / 100 * float64(len(sorted))))
	return sorted[max(rank, 1)-1]
}
