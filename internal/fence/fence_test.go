package fence_test

import (
	"errors"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/volerr"
)

// mustConflict wants a *ConflictError naming the holder's pod and node.
func mustConflict(t *testing.T, err error, holderNode, holderPod string) {
	t.Helper()
	var ce *fence.ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("got %v, want a *ConflictError", err)
	}
	if ce.Holder.Node != holderNode || ce.Holder.Pod != holderPod {
		t.Fatalf("conflict names holder %s/%s, want %s/%s", ce.Holder.Node, ce.Holder.Pod, holderNode, holderPod)
	}
	for _, want := range []string{holderNode, holderPod} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

func mustAcquire(t *testing.T, f *fence.Fencer, r fence.Request) {
	t.Helper()
	if err := f.Acquire(ctxT(t), r); err != nil {
		t.Fatalf("acquire %s on %s (%s): %v", r.Volume, r.Node, r.MountDir, err)
	}
}

func TestReadWriteOnceSingleNode(t *testing.T) {
	f, _ := newFencer(t)
	mkNode(t, "rwo-a")
	mkNode(t, "rwo-b")
	cleanupVolume(t, "vol-rwo")
	p1, p2, p3 := fakePod("rwo-p1"), fakePod("rwo-p2"), fakePod("rwo-p3")
	mustAcquire(t, f, stageReq("vol-rwo", "rwo-a", v1.ReadWriteOnce))
	mustAcquire(t, f, podReq("vol-rwo", "rwo-a", p1, v1.ReadWriteOnce))
	mustAcquire(t, f, podReq("vol-rwo", "rwo-a", p2, v1.ReadWriteOnce)) // any pods on the node
	mustConflict(t, f.Acquire(ctxT(t), stageReq("vol-rwo", "rwo-b", v1.ReadWriteOnce)), "rwo-a", "")
	mustConflict(t, f.Acquire(ctxT(t), podReq("vol-rwo", "rwo-b", p3, v1.ReadWriteOnce)), "rwo-a", "")
	if got := len(getAttachment(t, "vol-rwo").Spec.Attachments); got != 3 {
		t.Fatalf("attachment has %d entries, want 3", got)
	}
}

func TestReadWriteOncePodOnePod(t *testing.T) {
	f, rec := newFencer(t)
	mkNode(t, "rwop-a")
	mkNode(t, "rwop-b")
	cleanupVolume(t, "vol-rwop")
	p1, p2 := fakePod("rwop-p1"), fakePod("rwop-p2")
	mustAcquire(t, f, stageReq("vol-rwop", "rwop-a", v1.ReadWriteOncePod))
	mustAcquire(t, f, podReq("vol-rwop", "rwop-a", p1, v1.ReadWriteOncePod))
	// A second pod is refused on the same node and, at stage time, on another.
	mustConflict(t, f.Acquire(ctxT(t), podReq("vol-rwop", "rwop-a", p2, v1.ReadWriteOncePod)), "rwop-a", "rwop-p1")
	mustConflict(t, f.Acquire(ctxT(t), stageReq("vol-rwop", "rwop-b", v1.ReadWriteOncePod)), "rwop-a", "")
	// The refusal is recorded on the Attachment and on the requesting pod.
	var events []string
	for len(rec.Events) > 0 {
		events = append(events, <-rec.Events)
	}
	joined := strings.Join(events, "\n")
	if !strings.Contains(joined, "FenceConflict refused pod default/rwop-p2") || !strings.Contains(joined, "FenceConflict volume vol-rwop is held by pod default/rwop-p1") {
		t.Errorf("events do not record the refusal on attachment and pod:\n%s", joined)
	}
	// The holder leaves: the volume moves to the other pod on the other node.
	for _, r := range []fence.Request{podReq("vol-rwop", "rwop-a", p1, v1.ReadWriteOncePod), stageReq("vol-rwop", "rwop-a", v1.ReadWriteOncePod)} {
		if err := f.Release(ctxT(t), r.Volume, r.Node, r.MountDir); err != nil {
			t.Fatal(err)
		}
	}
	mustAcquire(t, f, stageReq("vol-rwop", "rwop-b", v1.ReadWriteOncePod))
	mustAcquire(t, f, podReq("vol-rwop", "rwop-b", p2, v1.ReadWriteOncePod))
}

func TestManyModes(t *testing.T) {
	f, _ := newFencer(t)
	cleanupVolume(t, "vol-rwx")
	cleanupVolume(t, "vol-rox")
	for i, n := range []string{"many-a", "many-b", "many-c"} {
		p := fakePod("many-p" + string(rune('0'+i)))
		mustAcquire(t, f, stageReq("vol-rwx", n, v1.ReadWriteMany))
		mustAcquire(t, f, podReq("vol-rwx", n, p, v1.ReadWriteMany))
		ro := podReq("vol-rox", n, p, v1.ReadOnlyMany)
		ro.ReadOnly = true
		mustAcquire(t, f, ro)
	}
	if got := len(getAttachment(t, "vol-rwx").Spec.Attachments); got != 6 {
		t.Fatalf("rwx attachment has %d entries, want 6", got)
	}
	mustAcquire(t, f, stageReq("vol-rox", "many-a", v1.ReadOnlyMany)) // NodeStage: read-only implied
	for _, e := range getAttachment(t, "vol-rox").Spec.Attachments {
		if !e.ReadOnly {
			t.Fatalf("ReadOnlyMany entry %+v is not read-only", e)
		}
	}
	rw := podReq("vol-rox", "many-a", fakePod("many-rw"), v1.ReadOnlyMany)
	if err := f.Acquire(ctxT(t), rw); !errors.Is(err, volerr.ErrInvalid) {
		t.Fatalf("read-write on ReadOnlyMany: got %v, want volerr.ErrInvalid", err)
	}
	// A request under another mode is refused while holders remain.
	mustConflict(t, f.Acquire(ctxT(t), stageReq("vol-rwx", "many-a", v1.ReadWriteOnce)), "many-a", "many-p0")
}

func TestIdempotentAcquireRelease(t *testing.T) {
	f, _ := newFencer(t)
	cleanupVolume(t, "vol-idem")
	r := podReq("vol-idem", "idem-a", fakePod("idem-p"), v1.ReadWriteOnce)
	mustAcquire(t, f, r)
	rv := getAttachment(t, "vol-idem").ResourceVersion
	mustAcquire(t, f, r)
	if got := getAttachment(t, "vol-idem").ResourceVersion; got != rv {
		t.Errorf("second acquire wrote the object (rv %s -> %s)", rv, got)
	}
	holds, err := f.ListForNode(ctxT(t), "idem-a")
	if err != nil || len(holds) != 1 || holds[0].Volume != "vol-idem" || holds[0].Entry.MountDir != r.MountDir {
		t.Fatalf("ListForNode = %+v, %v", holds, err)
	}
	for range 2 {
		if err := f.Release(ctxT(t), r.Volume, r.Node, r.MountDir); err != nil {
			t.Fatalf("release: %v", err)
		}
	}
	err = env.Client.Get(ctxT(t), client.ObjectKey{Name: "vol-idem"}, getAttachmentShell())
	if !apierrors.IsNotFound(err) {
		t.Fatalf("after the last release the attachment should be gone: %v", err)
	}
	if hs, _, err := f.Holders(ctxT(t), "vol-idem"); err != nil || len(hs) != 0 {
		t.Fatalf("Holders after release = %v, %v", hs, err)
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	f, _ := newFencer(t)
	bad := []fence.Request{
		{Node: "n", MountDir: "/m", AccessMode: v1.ReadWriteOnce},
		{Volume: "vol-bad", MountDir: "/m", AccessMode: v1.ReadWriteOnce},
		{Volume: "vol-bad", Node: "n", AccessMode: v1.ReadWriteOnce},
		{Volume: "vol-bad", Node: "n", MountDir: "/m", AccessMode: "Sometimes"},
		{Volume: "vol-bad", Node: "n", MountDir: "/m", AccessMode: v1.ReadWriteOnce, Pod: "p"},
	}
	for _, r := range bad {
		if err := f.Acquire(ctxT(t), r); !errors.Is(err, volerr.ErrInvalid) {
			t.Errorf("Acquire(%+v) = %v, want volerr.ErrInvalid", r, err)
		}
	}
	if err := f.Release(ctxT(t), "vol-bad", "", "/m"); !errors.Is(err, volerr.ErrInvalid) {
		t.Errorf("Release without node = %v, want volerr.ErrInvalid", err)
	}
	if err := env.Client.Get(ctxT(t), client.ObjectKey{Name: "vol-bad"}, getAttachmentShell()); !apierrors.IsNotFound(err) {
		t.Fatalf("bad input created an attachment: %v", err)
	}
}

func getAttachmentShell() *v1.Attachment { return &v1.Attachment{} }

// TestTerminatingAttachmentIsNotReused (F4): an Attachment kept by a
// finalizer after its delete takes no new hold, and once it is gone the
// volume is acquired anew. Before, the fencer added its entry to the
// terminating object, which vanished with the entry when the finalizer went.
func TestTerminatingAttachmentIsNotReused(t *testing.T) {
	f, _ := newFencer(t)
	mkNode(t, "term-a")
	mkNode(t, "term-c")
	cleanupVolume(t, "vol-term")
	mustAcquire(t, f, stageReq("vol-term", "term-a", v1.ReadWriteOnce))
	att := getAttachment(t, "vol-term")
	att.Finalizers = []string{"example.com/hold"}
	if err := env.Client.Update(ctxT(t), att); err != nil {
		t.Fatal(err)
	}
	if err := f.Release(ctxT(t), "vol-term", "term-a", stageReq("vol-term", "term-a", v1.ReadWriteOnce).MountDir); err != nil {
		t.Fatal(err)
	}
	if att := getAttachment(t, "vol-term"); att.DeletionTimestamp == nil {
		t.Fatalf("the last release left the Attachment without a deletion timestamp: %+v", att.ObjectMeta)
	}
	err := f.Acquire(ctxT(t), stageReq("vol-term", "term-c", v1.ReadWriteOnce))
	if !errors.Is(err, fence.ErrTerminating) || !errors.Is(err, volerr.ErrBusy) {
		t.Fatalf("acquire on a terminating Attachment: %v, want ErrTerminating (busy)", err)
	}
	for _, e := range getAttachment(t, "vol-term").Spec.Attachments {
		if e.Node == "term-c" {
			t.Fatalf("the terminating Attachment took term-c's entry: %+v", e)
		}
	}
	att = getAttachment(t, "vol-term")
	att.Finalizers = nil
	if err := env.Client.Update(ctxT(t), att); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, f, stageReq("vol-term", "term-c", v1.ReadWriteOnce))
}

// TestReportStagedCephClientsNeedAHold (F3): Ceph clients reported for a
// node that holds no entry (its hold broken or released meanwhile, or the
// Attachment gone) would never be recorded: ErrNotHeld, so that the stage
// does not use the device. Before, the report returned nil having written
// nothing. Without clients, a report on nothing held is still no error.
func TestReportStagedCephClientsNeedAHold(t *testing.T) {
	f, _ := newFencer(t)
	mkNode(t, "rep-a")
	cleanupVolume(t, "vol-rep")
	clients := fence.Staged{Node: "rep-a", DevicePath: "/dev/nbd2", StagingPath: "/s", CephClients: []string{"10.0.0.5:0/1"}}
	if err := f.ReportStaged(ctxT(t), "vol-rep", clients); !errors.Is(err, fence.ErrNotHeld) {
		t.Fatalf("clients on a missing Attachment: %v, want ErrNotHeld", err)
	}
	if err := f.ReportStaged(ctxT(t), "vol-rep", fence.Staged{Node: "rep-a", DevicePath: "/dev/loop2"}); err != nil {
		t.Fatalf("a device without clients on a missing Attachment: %v, want nil", err)
	}
	mustAcquire(t, f, stageReq("vol-rep", "rep-other", v1.ReadWriteMany))
	if err := f.ReportStaged(ctxT(t), "vol-rep", clients); !errors.Is(err, fence.ErrNotHeld) {
		t.Fatalf("clients of a node without an entry: %v, want ErrNotHeld", err)
	}
	mustAcquire(t, f, stageReq("vol-rep", "rep-a", v1.ReadWriteMany))
	if err := f.ReportStaged(ctxT(t), "vol-rep", clients); err != nil {
		t.Fatalf("clients of a holder: %v", err)
	}
}
