package fence_test

import (
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
)

// newGC returns a GC with its own metrics registry. The GC sweeps every
// Attachment, so the test first removes what other tests may have left.
func newGC(t *testing.T) (*fence.GC, *prometheus.Registry) {
	t.Helper()
	needEnv(t)
	if err := env.Client.DeleteAllOf(ctxT(t), &v1.Attachment{}); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	g, err := fence.NewGC(env.Client, clocktesting.NewFakeClock(time.Now()), testr.New(t), reg, fence.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return g, reg
}

// counters reads scanned, moved and dropped from the registry.
func counters(t *testing.T, reg *prometheus.Registry) [3]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out [3]float64
	for _, mf := range mfs {
		for i, name := range []string{"scanned", "moved", "dropped"} {
			if mf.GetName() == "berth_attachment_gc_entries_"+name+"_total" {
				out[i] = mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
	}
	return out
}

// TestGCNodeGone: the stage record of a gone node moves to its list, its pod
// entries are dropped; a live node's entries stay.
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
	if err != nil || res != (fence.GCResult{Scanned: 4, Moved: 1, Dropped: 1}) {
		t.Fatalf("RunOnce = %+v, %v", res, err)
	}
	if got := counters(t, reg); got != [3]float64{4, 1, 1} {
		t.Fatalf("metrics scanned/moved/dropped = %v, want [4 1 1]", got)
	}
	wantHolders(t, "vol-gc1", "gc-live", "gc-live")
	wantStale(t, "gc-gone", "vol-gc1", 1, v1.ReasonNodeGone)
	if s := getCleanup(t, "gc-gone").Spec.Entries[0]; s.Pod != "" {
		t.Fatalf("moved entry %+v, want the stage record", s)
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
	needEnv(t)
	clk := clocktesting.NewFakeClock(time.Now())
	reg := prometheus.NewRegistry()
	g, err := fence.NewGC(env.Client, clk, testr.New(t), reg, fence.Options{})
	if err != nil {
		t.Fatal(err)
	}
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
	background(t, g.Start)
	waitFor(t, "first sweep", clk.HasWaiters)
	mustAcquire(t, f, podReq("vol-gc4", "gc-tick", fakePod("gc-tick-pod"), v1.ReadWriteOnce)) // node gone
	clk.Step(3 * time.Second)
	waitFor(t, "sweep after 3s", func() bool { return counters(t, reg)[2] >= 1 })
}
