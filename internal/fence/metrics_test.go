package fence_test

import (
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/metrics"
	"github.com/berth-io/berth/internal/testenv"
)

// onRegistry makes a metric set with newSet on a registry of its own.
func onRegistry[M any](t *testing.T, newSet func(prometheus.Registerer) (M, error)) (M, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := newSet(reg)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

func wantSamples(t *testing.T, reg prometheus.Gatherer, want map[string]float64) {
	t.Helper()
	got, err := testenv.Gathered(reg)
	if err != nil {
		t.Fatal(err)
	}
	for s, n := range want {
		if got[s] != n {
			t.Errorf("%s = %v, want %v", s, got[s], n)
		}
	}
}

// TestFencerCountsDecisions: on the real API server, grants, a refusal, an
// invalid request, a lock broken from a gone node and releases are counted
// by result, each acquire timed.
func TestFencerCountsDecisions(t *testing.T) {
	suite.Require(t)
	m, reg := onRegistry(t, metrics.NewFence)
	f := fence.New(env.Client, record.NewFakeRecorder(100), clock.RealClock{}, testr.New(t), fence.Options{Metrics: m})
	mkNode(t, "fm-a")
	mkNode(t, "fm-b")
	cleanupVolume(t, "vol-fm", "fm-gone")
	cleanupVolume(t, "vol-fm2")
	mustAcquire(t, f, stageReq("vol-fm", "fm-a", v1.ReadWriteOnce))
	mustConflict(t, f.Acquire(ctxT(t), stageReq("vol-fm", "fm-b", v1.ReadWriteOnce)), "fm-a", "")
	if err := f.Acquire(ctxT(t), fence.Request{Volume: "vol-fm", Node: "fm-b", AccessMode: v1.ReadWriteOnce}); err == nil {
		t.Fatal("a request without mountDir was granted")
	}
	if err := f.Release(ctxT(t), "vol-fm", "fm-a", stageReq("vol-fm", "fm-a", v1.ReadWriteOnce).MountDir); err != nil {
		t.Fatal(err)
	}
	// fm-gone has no Node object: its hold is broken by fm-b.
	holdOn(t, "vol-fm2", "fm-gone", fakePod("fm-p1"), v1.ReadWriteOnce)
	mustAcquire(t, f, stageReq("vol-fm2", "fm-b", v1.ReadWriteOnce))
	wantSamples(t, reg, map[string]float64{
		testenv.Series("berth_fence_acquires_total", "result", "granted"):     2,
		testenv.Series("berth_fence_acquires_total", "result", "conflict"):    1,
		testenv.Series("berth_fence_acquires_total", "result", "invalid"):     1,
		testenv.Series("berth_fence_releases_total", "result", "ok"):          1,
		testenv.Series("berth_fence_lock_breaks_total", "reason", "NodeGone"): 1,
		"berth_fence_acquire_duration_seconds_count":                          4,
	})
}

// TestCleanerCountsEntries: one pass over a stale list with an entry undone,
// one failing and one refused is counted by result.
func TestCleanerCountsEntries(t *testing.T) {
	suite.Require(t)
	m, reg := onRegistry(t, metrics.NewCleanup)
	cleanupVolume(t, "vol-clm", "clm-a")
	addStaleEntry(t, "clm-a",
		v1.StaleAttachment{Volume: "vol-clm", MountDir: "/ok", Reason: v1.ReasonPodGone, FoundAt: metav1.Now()},
		v1.StaleAttachment{Volume: "vol-clm", MountDir: "/busy", Reason: v1.ReasonPodGone, FoundAt: metav1.Now()},
		v1.StaleAttachment{Volume: "vol-clm", MountDir: "/etc", Reason: v1.ReasonPodGone, FoundAt: metav1.Now()})
	u := &recordingUndoer{fail: map[string]bool{"/busy": true}, refuse: map[string]bool{"/etc": true}}
	cl := fence.NewCleaner(env.Client, "clm-a", u, clocktesting.NewFakeClock(time.Now()), testr.New(t), fence.CleanerOptions{Metrics: m})
	if _, err := cl.RunOnce(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	wantSamples(t, reg, map[string]float64{
		testenv.Series("berth_stale_passes_total", "result", "ok"):       1,
		testenv.Series("berth_stale_entries_total", "result", "undone"):  1,
		testenv.Series("berth_stale_entries_total", "result", "failed"):  1,
		testenv.Series("berth_stale_entries_total", "result", "refused"): 1,
		testenv.Series("berth_stale_entries_total", "result", "dropped"): 0,
	})
}

// TestGCCountsRuns: every pass is counted (and timed) by result, beside the
// entry counters the GC already had.
func TestGCCountsRuns(t *testing.T) {
	g, reg := newGC(t)
	for range 2 {
		if _, err := g.RunOnce(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	wantSamples(t, reg, map[string]float64{
		testenv.Series("berth_attachment_gc_runs_total", "result", "ok"): 2,
		"berth_attachment_gc_duration_seconds_count":                     2,
	})
}
