package operator

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/testenv"
)

// TestAttachmentGCRunsInOperatorProcess: a real `berth operator` process,
// suite is the API server the operator process runs against.
var suite = &testenv.Suite{}

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, suite)) }

// started before any StorageCluster exists (as the chart installs it),
// sweeps Attachments on the interval of a StorageCluster made afterwards:
// an entry of a pod that does not exist on a live node and the stage record
// of a node that is gone move to their nodes' stale lists within seconds,
// the emptied Attachment is deleted, and the operator's /metrics counts the
// passes and the moved entries. (Today's operator waits out the default
// day it read at start before it reads the cluster's interval.)
func TestAttachmentGCRunsInOperatorProcess(t *testing.T) {
	env := suite.Require(t)
	dir := t.TempDir()
	berth, err := testenv.BuildBerth(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "berth-system"}}); err != nil {
		t.Fatal(err)
	}
	metricsAddr, err := testenv.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "operator.log")
	op, err := testenv.StartProcess(logPath, berth, "operator", "--kubeconfig", kubeconfig, "--namespace", "berth-system",
		"--leader-elect=false", "--health-addr", "0", "--metrics-addr", metricsAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		op.Stop(syscall.SIGTERM, 30*time.Second)
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("operator log:\n%s", b)
		}
	})
	url := "http://" + metricsAddr + "/metrics"
	runs := func() float64 {
		s, err := testenv.Scrape(ctx, url)
		if err != nil {
			return -1
		}
		return s[testenv.Series("berth_attachment_gc_runs_total", "result", "ok")]
	}
	waitUntil(t, op, "the GC's pass at start", func() bool { return runs() >= 1 })

	sc := &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "gc-cluster"},
		Spec: v1.StorageClusterSpec{AttachmentGC: v1.AttachmentGCSpec{Interval: &metav1.Duration{Duration: time.Second}}}}
	if err := env.Client.Create(ctx, sc); err != nil {
		t.Fatal(err)
	}
	// Entries made after a pass that the cluster's interval brought: the
	// next passes, one a second, must collect them.
	start := runs()
	waitUntil(t, op, "a pass on the cluster's 1s interval", func() bool { return runs() > start })
	if err := env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gc-live"}}); err != nil {
		t.Fatal(err)
	}
	f := fence.New(env.Client, record.NewFakeRecorder(16), clock.RealClock{}, logr.Discard(), fence.Options{})
	staging := "/var/lib/kubelet/plugins/kubernetes.io/csi/berth.io/gc-vol/globalmount"
	for _, r := range []fence.Request{
		{Volume: "gc-vol", Node: "gc-gone", MountDir: staging, StagingPath: staging, AccessMode: v1.ReadWriteMany},
		{Volume: "gc-vol", Node: "gc-live", MountDir: staging, StagingPath: staging, AccessMode: v1.ReadWriteMany},
		{Volume: "gc-vol", Node: "gc-live", StagingPath: staging, AccessMode: v1.ReadWriteMany,
			PodNamespace: "default", Pod: "no-such-pod", PodUID: "uid-no-such-pod",
			MountDir: "/var/lib/kubelet/pods/uid-no-such-pod/volumes/kubernetes.io~csi/gc-vol/mount"},
	} {
		if err := f.Acquire(ctx, r); err != nil {
			t.Fatalf("acquire %+v: %v", r, err)
		}
	}

	stale := func(node string) []v1.StaleAttachment {
		nc := &v1.NodeCleanup{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, nc); err != nil {
			return nil
		}
		return nc.Spec.Entries
	}
	waitUntil(t, op, "the GC to move the entries of the gone node and the gone pod", func() bool {
		return len(stale("gc-gone")) == 1 && len(stale("gc-live")) == 1
	})
	if e := stale("gc-gone")[0]; e.Reason != v1.ReasonNodeGone || e.Pod != "" {
		t.Errorf("stale entry of the gone node: %+v, want the stage record, NodeGone", e)
	}
	if e := stale("gc-live")[0]; e.Reason != v1.ReasonPodGone || e.PodUID != "uid-no-such-pod" {
		t.Errorf("stale entry of the live node: %+v, want the gone pod's, PodGone", e)
	}
	att := &v1.Attachment{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "gc-vol"}, att); err != nil {
		t.Fatal(err)
	}
	if len(att.Spec.Attachments) != 1 || att.Spec.Attachments[0].Node != "gc-live" || !att.Spec.Attachments[0].IsStage() {
		t.Errorf("Attachment after the GC: %+v, want only the live node's stage record", att.Spec.Attachments)
	}
	s, err := testenv.Scrape(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if moved := s["berth_attachment_gc_entries_moved_total"]; moved < 2 {
		t.Errorf("berth_attachment_gc_entries_moved_total = %v, want at least 2", moved)
	}

	// The stage record of the live node goes when its node does.
	if err := env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gc-live"}}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, op, "the GC to empty and delete the Attachment", func() bool {
		return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKey{Name: "gc-vol"}, att))
	})
	if n := len(stale("gc-live")); n != 2 {
		t.Errorf("stale list of gc-live holds %d entries, want 2 (the pod's and the stage record)", n)
	}
}

// waitUntil polls done for up to 30s; it fails at once when the operator
// process has ended.
func waitUntil(t *testing.T, op *testenv.Process, what string, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !done() {
		if op.Exited() {
			t.Fatalf("the operator process exited while waiting for %s", what)
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 30s waiting for %s", what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
