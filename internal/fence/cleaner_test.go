package fence_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/testenv"
)

// recordingUndoer records what it was asked to undo; fail makes mountDirs
// fail, refuse makes them refused (ErrRefused).
type recordingUndoer struct {
	mu     sync.Mutex
	done   []string
	fail   map[string]bool
	refuse map[string]bool
}

func (u *recordingUndoer) Undo(_ context.Context, s v1.StaleAttachment) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.fail[s.MountDir] {
		return errors.New("device busy")
	}
	if u.refuse[s.MountDir] {
		return fmt.Errorf("%s is outside the node's folders: %w", s.MountDir, fence.ErrRefused)
	}
	u.done = append(u.done, s.Volume+":"+s.MountDir)
	return nil
}

func (u *recordingUndoer) undone() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.done...)
}

// TestCleanerAfterRestart: node cl-a lost its holds while its agent was
// down; the agent starts, its cleaner undoes the stale list at once, then
// picks up new entries on the next tick.
func TestCleanerAfterRestart(t *testing.T) {
	f, _ := newFencer(t)
	cleanupVolume(t, "vol-cl1", "cl-a")
	cleanupVolume(t, "vol-cl2")
	mkNode(t, "cl-b")
	holdOn(t, "vol-cl1", "cl-a", fakePod("cl-p1"), v1.ReadWriteOnce) // cl-a has no Node object: gone
	mustAcquire(t, f, stageReq("vol-cl1", "cl-b", v1.ReadWriteOnce)) // takeover fills cl-a's list
	wantStale(t, "cl-a", "vol-cl1", 2, v1.ReasonNodeGone)

	clk := clocktesting.NewFakeClock(time.Now())
	u := &recordingUndoer{}
	cl := fence.NewCleaner(env.Client, "cl-a", u, clk, testr.New(t), fence.CleanerOptions{Interval: time.Minute})
	testenv.Serve(t, "cleaner", cl.Start)

	waitFor(t, "first pass at start", func() bool { return len(u.undone()) == 2 && clk.HasWaiters() })
	nc := getCleanup(t, "cl-a")
	if len(nc.Spec.Entries) != 0 || nc.Status.Pending != 0 || nc.Status.LastProcessed == nil ||
		!meta.IsStatusConditionTrue(nc.Status.Conditions, v1.ConditionReady) {
		t.Fatalf("after the pass: entries %v, status %+v", nc.Spec.Entries, nc.Status)
	}

	// cl-a came back and holds vol-cl2 again (the Node object returns).
	mkNode(t, "cl-a")
	mustAcquire(t, f, stageReq("vol-cl2", "cl-a", v1.ReadWriteOnce))
	addStaleEntry(t, "cl-a", v1.StaleAttachment{Volume: "vol-cl2", MountDir: stageReq("vol-cl2", "", "").MountDir,
		Reason: v1.ReasonNodeOutOfService, FoundAt: metav1.Now()})
	clk.Step(time.Minute)
	waitFor(t, "second pass", func() bool { return len(getCleanup(t, "cl-a").Spec.Entries) == 0 })
	if got := u.undone(); len(got) != 2 {
		t.Fatalf("an entry the Attachment holds again was undone: %v", got)
	}
}

// TestCleanerNeverUndoesAHeldPath: another node may add entries to this
// node's stale list (lock breaking), so an entry that names a path this
// node holds for the volume, under another pod UID or as a stage record's
// staging path, is dropped without undo: no node unmounts another's live
// pod or stage by its word (F2). A stage entry that names another staging
// path while the node holds the volume staged is refused: its undo would
// unmount the volume's device everywhere on the node. The entry for a path
// not held is undone.
func TestCleanerNeverUndoesAHeldPath(t *testing.T) {
	cleanupVolume(t, "vol-f2", "f2-a")
	mkNode(t, "f2-a")
	live := fakePod("f2-live")
	holdOn(t, "vol-f2", "f2-a", live, v1.ReadWriteOnce)
	stage, pod := stageReq("vol-f2", "f2-a", v1.ReadWriteOnce), podReq("vol-f2", "f2-a", live, v1.ReadWriteOnce)
	gone := "/var/lib/kubelet/pods/uid-f2-gone/volumes/kubernetes.io~csi/vol-f2/mount"
	madeUp := "/var/lib/kubelet/plugins/kubernetes.io/csi/berth.io/made-up/globalmount"
	addStaleEntry(t, "f2-a",
		// The live pod's mount, as another pod's.
		v1.StaleAttachment{Volume: "vol-f2", MountDir: pod.MountDir, StagingPath: stage.StagingPath,
			Pod: "default/forged", PodUID: "forged", Reason: v1.ReasonPodGone, FoundAt: metav1.Now()},
		// The live stage, named as a stage record's staging path.
		v1.StaleAttachment{Volume: "vol-f2", MountDir: "/var/lib/kubelet/plugins/berth.io/staging/other",
			StagingPath: stage.StagingPath, Reason: v1.ReasonNodeOutOfService, FoundAt: metav1.Now()},
		// A stage record at a made-up staging path: refused.
		v1.StaleAttachment{Volume: "vol-f2", MountDir: madeUp, StagingPath: madeUp,
			Reason: v1.ReasonNodeOutOfService, FoundAt: metav1.Now()},
		// A pod of this node that is gone: undone.
		v1.StaleAttachment{Volume: "vol-f2", MountDir: gone, StagingPath: stage.StagingPath,
			Pod: "default/f2-gone", PodUID: "uid-f2-gone", Reason: v1.ReasonPodGone, FoundAt: metav1.Now()})

	u := &recordingUndoer{}
	cl := fence.NewCleaner(env.Client, "f2-a", u, clocktesting.NewFakeClock(time.Now()), testr.New(t), fence.CleanerOptions{Interval: time.Minute})
	res, err := cl.RunOnce(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if want := (fence.CleanResult{Undone: 1, Dropped: 2, Refused: 1}); res != want {
		t.Errorf("pass %+v, want %+v", res, want)
	}
	if c := meta.FindStatusCondition(getCleanup(t, "f2-a").Status.Conditions, v1.ConditionReady); c == nil || !strings.Contains(c.Message, madeUp) {
		t.Errorf("Ready condition %+v does not name the refused path", c)
	}
	if got := u.undone(); len(got) != 1 || got[0] != "vol-f2:"+gone {
		t.Errorf("undone %v, want only the gone pod's mount", got)
	}
	if n := len(getCleanup(t, "f2-a").Spec.Entries); n != 0 {
		t.Errorf("%d entries left, want the held ones dropped and the gone one done", n)
	}
	wantHolders(t, "vol-f2", "f2-a", "f2-a") // its stage and its pod
}

// TestCleanerRetriesFailedEntriesSoon: an undo that fails at the agent's
// start (its keeper not up yet after the node's return) is tried again
// after FailedRetry, not an Interval later.
func TestCleanerRetriesFailedEntriesSoon(t *testing.T) {
	suite.Require(t)
	cleanupVolume(t, "vol-clr", "clr-a")
	addStaleEntry(t, "clr-a", v1.StaleAttachment{Volume: "vol-clr", MountDir: "/later", Reason: v1.ReasonNodeOutOfService, FoundAt: metav1.Now()})
	clk := clocktesting.NewFakeClock(time.Now())
	u := &recordingUndoer{fail: map[string]bool{"/later": true}}
	cl := fence.NewCleaner(env.Client, "clr-a", u, clk, testr.New(t),
		fence.CleanerOptions{Interval: time.Hour, FailedRetry: 10 * time.Second})
	testenv.Serve(t, "cleaner", cl.Start)
	waitFor(t, "the failed first pass", func() bool { return getCleanup(t, "clr-a").Status.Pending == 1 && clk.HasWaiters() })
	u.mu.Lock()
	u.fail = nil // the keeper is up
	u.mu.Unlock()
	clk.Step(10 * time.Second)
	waitFor(t, "the retry", func() bool { return len(getCleanup(t, "clr-a").Spec.Entries) == 0 })
	if got := u.undone(); len(got) != 1 || got[0] != "vol-clr:/later" {
		t.Fatalf("undone %v", got)
	}
}

func TestCleanerKeepsFailedEntries(t *testing.T) {
	nc, c := passWithBadEntry(t, "vol-clf", "clf-a", "/busy",
		&recordingUndoer{fail: map[string]bool{"/busy": true}}, fence.CleanResult{Undone: 1, Failed: 1})
	if len(nc.Spec.Entries) != 1 || nc.Spec.Entries[0].MountDir != "/busy" || nc.Status.Pending != 1 ||
		c == nil || c.Status != metav1.ConditionFalse || c.Reason != "UndoFailed" {
		t.Fatalf("after a failed undo: entries %v, status %+v", nc.Spec.Entries, nc.Status)
	}
}

// passWithBadEntry puts two stale entries of volume on node's list, one at
// /ok and one at bad, runs one cleaner pass with u, checks its result is
// want, and returns the list and its Ready condition after the pass.
func passWithBadEntry(t *testing.T, volume, node, bad string, u *recordingUndoer, want fence.CleanResult) (*v1.NodeCleanup, *metav1.Condition) {
	t.Helper()
	suite.Require(t)
	cleanupVolume(t, volume, node)
	addStaleEntry(t, node,
		v1.StaleAttachment{Volume: volume, MountDir: "/ok", Reason: v1.ReasonPodGone, FoundAt: metav1.Now()},
		v1.StaleAttachment{Volume: volume, MountDir: bad, Reason: v1.ReasonPodGone, FoundAt: metav1.Now()})
	cl := fence.NewCleaner(env.Client, node, u, clocktesting.NewFakeClock(time.Now()), testr.New(t), fence.CleanerOptions{})
	res, err := cl.RunOnce(ctxT(t))
	if err != nil || res != want {
		t.Fatalf("RunOnce = %+v, %v", res, err)
	}
	nc := getCleanup(t, node)
	return nc, meta.FindStatusCondition(nc.Status.Conditions, v1.ConditionReady)
}

// TestCleanerDropsRefusedEntries: an entry the Undoer refuses (a path
// outside the node's folders) can never be undone: it leaves the list, the
// pass says why, and nothing is retried.
func TestCleanerDropsRefusedEntries(t *testing.T) {
	nc, c := passWithBadEntry(t, "vol-clr", "clr-a", "/etc",
		&recordingUndoer{refuse: map[string]bool{"/etc": true}}, fence.CleanResult{Undone: 1, Refused: 1})
	if len(nc.Spec.Entries) != 0 || c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "/etc") {
		t.Fatalf("after a refused entry: entries %v, status %+v", nc.Spec.Entries, nc.Status)
	}
}

// TestCleanerSkipsBusyVolume: a volume whose lock stays held (an operation
// stuck on a dead device) is kept for the next pass after a bounded wait;
// the other volumes' entries are still undone.
func TestCleanerSkipsBusyVolume(t *testing.T) {
	suite.Require(t)
	cleanupVolume(t, "vol-clb", "clb-a")
	cleanupVolume(t, "vol-clb-busy", "clb-a")
	ok := v1.StaleAttachment{Volume: "vol-clb", MountDir: "/ok", Reason: v1.ReasonPodGone, FoundAt: metav1.Now()}
	stuck := v1.StaleAttachment{Volume: "vol-clb-busy", MountDir: "/stuck", Reason: v1.ReasonPodGone, FoundAt: metav1.Now()}
	addStaleEntry(t, "clb-a", stuck, ok)
	u := &recordingUndoer{}
	lock := func(ctx context.Context, volume string) (func(), error) {
		if volume == stuck.Volume {
			<-ctx.Done() // held by an operation that never ends
			return nil, ctx.Err()
		}
		return func() {}, nil
	}
	cl := fence.NewCleaner(env.Client, "clb-a", u, clocktesting.NewFakeClock(time.Now()), testr.New(t),
		fence.CleanerOptions{Lock: lock, LockWait: 100 * time.Millisecond})
	res, err := cl.RunOnce(ctxT(t))
	if err != nil || res != (fence.CleanResult{Undone: 1, Failed: 1}) {
		t.Fatalf("RunOnce = %+v, %v", res, err)
	}
	if got := u.undone(); len(got) != 1 || got[0] != "vol-clb:/ok" {
		t.Fatalf("undone %v, want only /ok", got)
	}
	if nc := getCleanup(t, "clb-a"); len(nc.Spec.Entries) != 1 || nc.Spec.Entries[0].MountDir != "/stuck" {
		t.Fatalf("entries after the pass: %v, want the busy volume's kept", nc.Spec.Entries)
	}
}

// addStaleEntry writes entries to a node's list as lock breaking or GC would.
func addStaleEntry(t *testing.T, node string, entries ...v1.StaleAttachment) {
	t.Helper()
	var nc v1.NodeCleanup
	nc.Name = node
	if err := env.Client.Get(ctxT(t), clientKey(node), &nc); err == nil {
		nc.Spec.Entries = append(nc.Spec.Entries, entries...)
		if err := env.Client.Update(ctxT(t), &nc); err != nil {
			t.Fatal(err)
		}
		return
	}
	nc.Spec.Entries = entries
	create(t, &nc)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, 20*time.Second, what, cond)
}
