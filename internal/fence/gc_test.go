package fence_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/testenv"
)

// newGC returns a GC with its own metrics registry. The GC sweeps every
// Attachment, so the test first removes what other tests may have left.
func newGC(t *testing.T) (*fence.GC, *prometheus.Registry) {
	t.Helper()
	suite.Require(t)
	if err := env.Client.DeleteAllOf(ctxT(t), &v1.Attachment{}); err != nil {
		t.Fatal(err)
	}
	return gcOn(t, clocktesting.NewFakeClock(time.Now()), fence.Options{})
}

// gcOn is a GC on clk with opts, its metrics on a registry of its own.
func gcOn(t *testing.T, clk clock.Clock, opts fence.Options) (*fence.GC, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	g, err := fence.NewGC(env.Client, clk, testr.New(t), reg, opts)
	if err != nil {
		t.Fatal(err)
	}
	return g, reg
}

// counters reads scanned, moved and dropped from the registry.
func counters(t *testing.T, reg *prometheus.Registry) [3]float64 {
	t.Helper()
	var out [3]float64
	for i, name := range []string{"scanned", "moved", "dropped"} {
		out[i] = counter(t, reg, "berth_attachment_gc_entries_"+name+"_total")
	}
	return out
}

// counter reads the unlabelled counter name from the registry (0 when it
// has no value yet).
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// TestGCNodeGone: the stage record and the pod entries of a gone node move
// to its list; a live node's entries stay.
func TestGCNodeGone(t *testing.T) {
	g, reg := newGC(t)
	cleanupVolume(t, "vol-gc1", "gc-gone")
	mkNode(t, "gc-live")
	live := mkPod(t, "gc-live-pod", "gc-live")
	f, _ := newFencer(t)
	for _, r := range []fence.Request{
		stageReq("vol-gc1", "gc-gone", v1.ReadWriteMany),
		podReq("vol-gc1", "gc-gone", fakePod("gc-gone-pod"), v1.ReadWriteMany),
		stageReq("vol-gc1", "gc-live", v1.ReadWriteMany),
		podReq("vol-gc1", "gc-live", live, v1.ReadWriteMany),
	} {
		mustAcquire(t, f, r)
	}
	res, err := g.RunOnce(ctxT(t))
	if err != nil || res.Scanned != 4 || res.Moved != 2 || res.Dropped != 0 {
		t.Fatalf("RunOnce = %+v, %v", res, err)
	}
	if got := counters(t, reg); got != [3]float64{4, 2, 0} {
		t.Fatalf("metrics scanned/moved/dropped = %v, want [4 2 0]", got)
	}
	wantHolders(t, "vol-gc1", "gc-live", "gc-live")
	wantStale(t, "gc-gone", "vol-gc1", 2, v1.ReasonNodeGone)
	pods := 0
	for _, s := range getCleanup(t, "gc-gone").Spec.Entries {
		if s.Pod == "default/gc-gone-pod" {
			pods++
		}
	}
	if pods != 1 {
		t.Fatalf("moved entries %+v, want the stage record and the pod's", getCleanup(t, "gc-gone").Spec.Entries)
	}
}

// TestGCPrunesStaleListsOfGoneNodes: a stale list whose node is gone is
// marked at the first pass and deleted once the TTL has passed; the mark of
// a node that came back is lifted and its list stays.
func TestGCPrunesStaleListsOfGoneNodes(t *testing.T) {
	suite.Require(t)
	clk := clocktesting.NewFakeClock(time.Now())
	g, reg := gcOn(t, clk, fence.Options{StaleListTTL: time.Hour})
	const pruned = "berth_attachment_gc_stale_lists_pruned_total"
	ctx := ctxT(t)
	entry := v1.StaleAttachment{Volume: "vol-x", MountDir: "/var/lib/kubelet/plugins/berth.io/pv/x/globalmount",
		Reason: v1.ReasonNodeGone, FoundAt: metav1.Now()}
	mkNode(t, "prune-back")
	for _, name := range []string{"prune-gone", "prune-back"} {
		nc := &v1.NodeCleanup{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.NodeCleanupSpec{Entries: []v1.StaleAttachment{entry}}}
		if name == "prune-back" {
			nc.Annotations = map[string]string{fence.NodeGoneSinceAnnotation: clk.Now().Add(-48 * time.Hour).UTC().Format(time.RFC3339)}
		}
		if err := env.Client.Create(ctx, nc); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(ctxT(t), nc) })
	}
	if res, err := g.RunOnce(ctx); err != nil || res.Pruned != 0 {
		t.Fatalf("first pass: %+v, %v", res, err)
	}
	if _, marked := getCleanup(t, "prune-gone").Annotations[fence.NodeGoneSinceAnnotation]; !marked {
		t.Fatal("the gone node's stale list is not marked")
	}
	if _, marked := getCleanup(t, "prune-back").Annotations[fence.NodeGoneSinceAnnotation]; marked {
		t.Fatal("the mark of a node that is back stays")
	}
	clk.Step(59 * time.Minute)
	if res, err := g.RunOnce(ctx); err != nil || res.Pruned != 0 {
		t.Fatalf("pass within the TTL: %+v, %v", res, err)
	}
	if n := counter(t, reg, pruned); n != 0 {
		t.Fatalf("%s = %v within the TTL, want 0", pruned, n)
	}
	clk.Step(2 * time.Minute)
	if res, err := g.RunOnce(ctx); err != nil || res.Pruned != 1 {
		t.Fatalf("pass after the TTL: %+v, %v", res, err)
	}
	if n := counter(t, reg, pruned); n != 1 {
		t.Fatalf("%s = %v after the TTL, want 1", pruned, n)
	}
	if err := env.Client.Get(ctx, clientKey("prune-gone"), &v1.NodeCleanup{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the gone node's stale list after the TTL: %v", err)
	}
	if len(getCleanup(t, "prune-back").Spec.Entries) != 1 {
		t.Fatal("the stale list of a live node was touched")
	}
}

// TestGCPodGone: on a live node, entries of a deleted pod and of a pod
// recreated under the same name (new UID) move to the node's list; the
// node's stage record stays. The emptied Attachment of another volume goes.
func TestGCPodGone(t *testing.T) {
	g, reg := newGC(t)
	cleanupVolume(t, "vol-gc2", "gc-node")
	cleanupVolume(t, "vol-gc3")
	mkNode(t, "gc-node")
	recreated := mkPod(t, "gc-sts-0", "gc-node")
	f, _ := newFencer(t)
	mustAcquire(t, f, stageReq("vol-gc2", "gc-node", v1.ReadWriteOnce))
	mustAcquire(t, f, podReq("vol-gc2", "gc-node", fakePod("gc-deleted"), v1.ReadWriteOnce))
	mustAcquire(t, f, podReq("vol-gc2", "gc-node", fakePod("gc-sts-0"), v1.ReadWriteOnce)) // old UID
	mustAcquire(t, f, podReq("vol-gc3", "gc-node", fakePod("gc-only"), v1.ReadWriteOnce))
	res, err := g.RunOnce(ctxT(t))
	if err != nil || res != (fence.GCResult{Scanned: 4, Moved: 3}) {
		t.Fatalf("RunOnce = %+v, %v", res, err)
	}
	if got := counters(t, reg); got != [3]float64{4, 3, 0} {
		t.Fatalf("metrics scanned/moved/dropped = %v, want [4 3 0]", got)
	}
	wantHolders(t, "vol-gc2", "gc-node")
	wantStale(t, "gc-node", "vol-gc2", 2, v1.ReasonPodGone)
	wantStale(t, "gc-node", "vol-gc3", 1, v1.ReasonPodGone)
	if err := env.Client.Get(ctxT(t), clientKey("vol-gc3"), &v1.Attachment{}); !apierrors.IsNotFound(err) {
		t.Fatalf("emptied attachment vol-gc3 still there: %v", err)
	}
	// The live pod's own entry is never touched.
	mustAcquire(t, f, podReq("vol-gc2", "gc-node", recreated, v1.ReadWriteOnce))
	if res, err := g.RunOnce(ctxT(t)); err != nil || res.Moved+res.Dropped != 0 {
		t.Fatalf("second pass = %+v, %v; want nothing moved", res, err)
	}
}

// TestGCInterval: the smallest StorageCluster interval wins, 24h without
// one; Start sweeps at once and again after each interval.
func TestGCInterval(t *testing.T) {
	suite.Require(t)
	clk := clocktesting.NewFakeClock(time.Now())
	g, reg := gcOn(t, clk, fence.Options{})
	if iv, err := g.Interval(ctxT(t)); err != nil || iv != fence.DefaultGCInterval {
		t.Fatalf("Interval without clusters = %v, %v", iv, err)
	}
	for name, iv := range map[string]time.Duration{"gc-slow": time.Hour, "gc-fast": 3 * time.Second} {
		create(t, &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1.StorageClusterSpec{AttachmentGC: v1.AttachmentGCSpec{Interval: &metav1.Duration{Duration: iv}}}})
	}
	if iv, err := g.Interval(ctxT(t)); err != nil || iv != 3*time.Second {
		t.Fatalf("Interval = %v, %v; want 3s", iv, err)
	}

	cleanupVolume(t, "vol-gc4", "gc-tick")
	f, _ := newFencer(t)
	testenv.Serve(t, "GC", g.Start)
	waitFor(t, "first sweep", clk.HasWaiters)
	mustAcquire(t, f, podReq("vol-gc4", "gc-tick", fakePod("gc-tick-pod"), v1.ReadWriteOnce)) // node gone
	clk.Step(3 * time.Second)
	waitFor(t, "sweep after 3s", func() bool { return counters(t, reg)[1] >= 1 })
}

// waitingGC runs a GC on a fake clock with no StorageCluster (so the
// default day's interval) and returns once its first sweep is done and it
// waits.
func waitingGC(t *testing.T) (*fence.GC, *prometheus.Registry, *clocktesting.FakeClock) {
	t.Helper()
	suite.Require(t)
	if err := env.Client.DeleteAllOf(ctxT(t), &v1.StorageCluster{}); err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Now())
	g, reg := gcOn(t, clk, fence.Options{})
	testenv.Serve(t, "GC", g.Start)
	waitFor(t, "first sweep, then the wait of a day", clk.HasWaiters)
	return g, reg, clk
}

// TestGCWakeAppliesNewInterval: a GC that started without a StorageCluster
// waits the default day; a cluster made afterwards with a short interval
// wakes it (the operator's StorageCluster watch calls Wake), and it sweeps
// on that interval without waiting the day out.
func TestGCWakeAppliesNewInterval(t *testing.T) {
	g, reg, clk := waitingGC(t)
	create(t, &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "gc-woken"},
		Spec: v1.StorageClusterSpec{AttachmentGC: v1.AttachmentGCSpec{Interval: &metav1.Duration{Duration: 2 * time.Second}}}})
	cleanupVolume(t, "vol-gc5", "gc-wake")
	f, _ := newFencer(t)
	mustAcquire(t, f, podReq("vol-gc5", "gc-wake", fakePod("gc-wake-pod"), v1.ReadWriteOnce)) // node gone
	g.Wake()
	// Step the clock until the sweep: the woken GC waits the new 2s.
	waitFor(t, "sweep on the new interval", func() bool {
		clk.Step(time.Second)
		return counters(t, reg)[1] >= 1
	})
}

// TestGCNodeLostBurst: a lost node (tainted out-of-service, or its Node
// deleted) starts a pass at once and a burst over the next minutes, while
// Kubernetes force-deletes its pods, then the GC waits its interval again.
// Before, the holds of a lost node's pods moved only at the next interval
// (a day by default), so a local volume's replacement pod waited that long.
func TestGCNodeLostBurst(t *testing.T) {
	g, reg, clk := waitingGC(t)
	g.NodeLost()
	waitFor(t, "a pass at once", func() bool { return runs(t, reg) == 2 })
	for i, step := range []time.Duration{10 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second} {
		waitFor(t, "the GC waiting", clk.HasWaiters)
		clk.Step(step)
		want := float64(3 + i)
		waitFor(t, fmt.Sprintf("burst pass %d", i+2), func() bool { return runs(t, reg) == want })
	}
	waitFor(t, "the GC waiting", clk.HasWaiters)
	clk.Step(time.Hour)
	time.Sleep(200 * time.Millisecond)
	if n := runs(t, reg); n != 7 {
		t.Fatalf("passes after the burst and an hour: %v, want 7 (the interval is a day)", n)
	}
}

// runs reads berth_attachment_gc_runs_total{result="ok"}.
func runs(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "berth_attachment_gc_runs_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == "ok" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
