package fence_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
)

// wantHolders wants exactly these nodes in the volume's Attachment.
func wantHolders(t *testing.T, volume string, nodes ...string) {
	t.Helper()
	var got []string
	for _, e := range getAttachment(t, volume).Spec.Attachments {
		got = append(got, e.Node)
	}
	if strings.Join(got, ",") != strings.Join(nodes, ",") {
		t.Fatalf("%s holders on nodes %v, want %v", volume, got, nodes)
	}
}

// wantStale wants the node's stale list to hold n entries of the volume, all for reason.
func wantStale(t *testing.T, node, volume string, n int, reason v1.CleanupReason) {
	t.Helper()
	nc := getCleanup(t, node)
	count := 0
	for _, s := range nc.Spec.Entries {
		if s.Volume == volume {
			count++
			if s.Reason != reason {
				t.Errorf("stale entry %s %s: reason %s, want %s", s.Volume, s.MountDir, s.Reason, reason)
			}
		}
	}
	if count != n {
		t.Fatalf("stale list of %s has %d entries of %s, want %d: %+v", node, count, volume, n, nc.Spec.Entries)
	}
}

// holdOn makes node hold the volume: its stage record and one pod's mount.
func holdOn(t *testing.T, volume, node string, p *corev1.Pod, mode v1.AccessMode) {
	t.Helper()
	f, _ := newFencer(t)
	mustAcquire(t, f, stageReq(volume, node, mode))
	mustAcquire(t, f, podReq(volume, node, p, mode))
}

func TestBreakWhenNodeGone(t *testing.T) {
	f, rec := newFencer(t)
	cleanupVolume(t, "vol-gone", "gone-a")
	mkNode(t, "gone-b")
	holdOn(t, "vol-gone", "gone-a", fakePod("gone-p1"), v1.ReadWriteOnce) // gone-a has no Node object
	mustAcquire(t, f, stageReq("vol-gone", "gone-b", v1.ReadWriteOnce))
	wantHolders(t, "vol-gone", "gone-b")
	wantStale(t, "gone-a", "vol-gone", 2, v1.ReasonNodeGone)
	if ev := <-rec.Events; !strings.Contains(ev, "FenceBroken") || !strings.Contains(ev, "gone-a") {
		t.Errorf("event %q does not record the takeover from gone-a", ev)
	}
}

func TestBreakWhenNodeOutOfService(t *testing.T) {
	f, _ := newFencer(t)
	cleanupVolume(t, "vol-oos", "oos-a", "oos-c")
	mkNode(t, "oos-a", corev1.Taint{Key: corev1.TaintNodeOutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute})
	mkNode(t, "oos-b")
	mkNode(t, "oos-c", corev1.Taint{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute})
	holdOn(t, "vol-oos", "oos-a", fakePod("oos-p1"), v1.ReadWriteOnce)
	mustAcquire(t, f, stageReq("vol-oos", "oos-b", v1.ReadWriteOnce))
	wantHolders(t, "vol-oos", "oos-b")
	wantStale(t, "oos-a", "vol-oos", 2, v1.ReasonNodeOutOfService)

	// Unreachable alone is not proof the node stopped writing: refused.
	mustConflict(t, f.Acquire(ctxT(t), stageReq("vol-oos", "oos-c", v1.ReadWriteOnce)), "oos-b", "")
}

func TestBreakWhenPodMoved(t *testing.T) {
	f, _ := newFencer(t)
	cleanupVolume(t, "vol-moved", "moved-a")
	for _, n := range []string{"moved-a", "moved-b", "moved-c"} {
		mkNode(t, n)
	}
	old := mkPod(t, "web-0", "moved-a")
	holdOn(t, "vol-moved", "moved-a", old, v1.ReadWriteOncePod)

	// The old pod object still exists: nothing is taken over.
	mustConflict(t, f.Acquire(ctxT(t), stageReq("vol-moved", "moved-b", v1.ReadWriteOncePod)), "moved-a", "")

	// Recreated (new UID) but scheduled elsewhere: still refused.
	deletePod(t, old)
	elsewhere := mkPod(t, "web-0", "moved-c")
	mustConflict(t, f.Acquire(ctxT(t), stageReq("vol-moved", "moved-b", v1.ReadWriteOncePod)), "moved-a", "")
	deletePod(t, elsewhere)

	// Recreated on moved-b: its stage (no pod known) and publish take over.
	successor := mkPod(t, "web-0", "moved-b")
	mustAcquire(t, f, stageReq("vol-moved", "moved-b", v1.ReadWriteOncePod))
	mustAcquire(t, f, podReq("vol-moved", "moved-b", successor, v1.ReadWriteOncePod))
	wantHolders(t, "vol-moved", "moved-b", "moved-b")
	wantStale(t, "moved-a", "vol-moved", 2, v1.ReasonPodMoved)
}

func TestBreakWhenPodMovedAtPublish(t *testing.T) {
	f, _ := newFencer(t)
	cleanupVolume(t, "vol-moved2", "moved2-a")
	mkNode(t, "moved2-a")
	mkNode(t, "moved2-b")
	old := mkPod(t, "db-0", "moved2-a")
	holdOn(t, "vol-moved2", "moved2-a", old, v1.ReadWriteOncePod)
	deletePod(t, old)
	successor := mkPod(t, "db-0", "moved2-b")
	// Another pod on the successor's node is not the successor: refused.
	mustConflict(t, f.Acquire(ctxT(t), podReq("vol-moved2", "moved2-b", fakePod("intruder"), v1.ReadWriteOncePod)), "moved2-a", "")
	mustAcquire(t, f, podReq("vol-moved2", "moved2-b", successor, v1.ReadWriteOncePod))
	wantHolders(t, "vol-moved2", "moved2-b")
	wantStale(t, "moved2-a", "vol-moved2", 2, v1.ReasonPodMoved)
}

// TestShareDeviceOnOneNode: a shared (RWX filesystem) volume's device is
// the share manager's alone, on one node at a time. Its stage and publish
// (SoleDevice) are refused while another node holds the device, whatever
// NFS clients hold; the NFS clients' entries never block it; and once the
// old share-manager pod is gone and its successor runs on the new node,
// the old node's device holds, and only those, are broken.
func TestShareDeviceOnOneNode(t *testing.T) {
	f, _ := newFencer(t)
	const vol = "vol-share"
	cleanupVolume(t, vol, "share-a", "share-b", "share-c")
	for _, n := range []string{"share-a", "share-b", "share-c"} {
		mkNode(t, n)
	}
	device := func(r fence.Request) fence.Request {
		r.SoleDevice = true
		return r
	}
	old := mkPod(t, "share-manager-"+vol, "share-a")
	mustAcquire(t, f, device(stageReq(vol, "share-a", v1.ReadWriteMany)))
	mustAcquire(t, f, device(podReq(vol, "share-a", old, v1.ReadWriteMany)))
	// NFS clients on every node: entries with no stage record behind them.
	for _, n := range []string{"share-a", "share-b", "share-c"} {
		client := podReq(vol, n, fakePod("web-"+n), v1.ReadWriteMany)
		client.StagingPath = "/var/lib/kubelet/plugins/kubernetes.io/csi/berth.io/workload/globalmount"
		mustAcquire(t, f, client)
	}

	// The device stays on share-a while its share manager lives there.
	mustConflict(t, f.Acquire(ctxT(t), device(stageReq(vol, "share-b", v1.ReadWriteMany))), "share-a", "")

	// Failed over: the old pod gone, its successor on share-b takes the
	// device; share-a's NFS client keeps its entry.
	deletePod(t, old)
	successor := mkPod(t, "share-manager-"+vol, "share-b")
	mustAcquire(t, f, device(stageReq(vol, "share-b", v1.ReadWriteMany)))
	mustAcquire(t, f, device(podReq(vol, "share-b", successor, v1.ReadWriteMany)))
	wantStale(t, "share-a", vol, 2, v1.ReasonPodMoved)
	var holds []string
	for _, e := range getAttachment(t, vol).Spec.Attachments {
		holds = append(holds, e.Node+"/"+e.Pod)
	}
	want := "share-a/web-share-a,share-b/web-share-b,share-c/web-share-c,share-b/,share-b/share-manager-" + vol
	if strings.Join(holds, ",") != want {
		t.Errorf("holders %v, want %s", holds, want)
	}
	// And share-c cannot take it from the live share-b.
	mustConflict(t, f.Acquire(ctxT(t), device(stageReq(vol, "share-c", v1.ReadWriteMany))), "share-b", "")
}
