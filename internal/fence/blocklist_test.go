package fence_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/volerr"
)

// fakeBlocklister records calls; fail, when set, is returned instead. At
// each FenceClients it records which nodes the Attachment still lists, so
// a test can check the blocklisting came before the release.
type fakeBlocklister struct {
	mu       sync.Mutex
	fail     error
	fenced   map[string][]string // address -> volume
	unfenced []string
	holders  [][]string // nodes of the Attachment at each FenceClients
}

func newFakeBlocklister() *fakeBlocklister {
	return &fakeBlocklister{fenced: map[string][]string{}}
}

func (b *fakeBlocklister) FenceClients(ctx context.Context, volume string, addrs []string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var att v1.Attachment
	var nodes []string
	if err := env.Client.Get(ctx, clientKey(volume), &att); err == nil {
		for _, e := range att.Spec.Attachments {
			nodes = append(nodes, e.Node)
		}
	}
	b.holders = append(b.holders, nodes)
	if b.fail != nil {
		return b.fail
	}
	for _, a := range addrs {
		b.fenced[a] = append(b.fenced[a], volume)
	}
	return nil
}

func (b *fakeBlocklister) UnfenceClients(_ context.Context, addrs []string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fail != nil {
		return b.fail
	}
	for _, a := range addrs {
		delete(b.fenced, a)
	}
	b.unfenced = append(b.unfenced, addrs...)
	return nil
}

func (b *fakeBlocklister) setFail(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fail = err
}

func (b *fakeBlocklister) isFenced(addr string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.fenced[addr]
	return ok
}

func newCephFencer(t *testing.T, bl fence.Blocklister) (*fence.Fencer, *record.FakeRecorder) {
	t.Helper()
	suite.Require(t)
	rec := record.NewFakeRecorder(100)
	return fence.New(env.Client, rec, clock.RealClock{}, testr.New(t), fence.Options{Blocklister: bl}), rec
}

// stagedWithClients makes node hold the volume (stage record and pod) and
// report it staged with Ceph clients, as the node side does at stage.
func stagedWithClients(t *testing.T, volume, node string, addrs ...string) {
	t.Helper()
	holdOn(t, volume, node, fakePod(volume+"-p"), v1.ReadWriteOnce)
	f, _ := newFencer(t)
	if err := f.ReportStaged(ctxT(t), volume, fence.Staged{Node: node, DevicePath: "/dev/loop9",
		StagingPath: stageReq(volume, node, v1.ReadWriteOnce).StagingPath, CephClients: addrs}); err != nil {
		t.Fatal(err)
	}
	if got := getAttachment(t, volume).Status.Nodes; len(got) != 1 || !slices.Equal(got[0].CephClients, addrs) {
		t.Fatalf("status after ReportStaged: %+v", got)
	}
}

// drain takes the Events recorded so far.
func drain(rec *record.FakeRecorder) []string {
	var out []string
	for len(rec.Events) > 0 {
		out = append(out, <-rec.Events)
	}
	return out
}

func hasEvent(evs []string, parts ...string) bool {
	return slices.ContainsFunc(evs, func(ev string) bool {
		for _, p := range parts {
			if !strings.Contains(ev, p) {
				return false
			}
		}
		return true
	})
}

func TestBreakBlocklistsCephClientsFirst(t *testing.T) {
	bl := newFakeBlocklister()
	f, rec := newCephFencer(t, bl)
	cleanupVolume(t, "vol-bl", "bl-a")
	mkNode(t, "bl-b")
	addrs := []string{"10.0.0.1:0/1234", "10.0.0.1:0/5678"}
	stagedWithClients(t, "vol-bl", "bl-a", addrs...) // bl-a has no Node object: gone
	mustAcquire(t, f, stageReq("vol-bl", "bl-b", v1.ReadWriteOnce))
	wantHolders(t, "vol-bl", "bl-b")
	for _, a := range addrs {
		if !bl.isFenced(a) {
			t.Errorf("%s not blocklisted", a)
		}
	}
	if len(bl.holders) != 1 || !slices.Equal(bl.holders[0], []string{"bl-a", "bl-a"}) {
		t.Errorf("at blocklisting the Attachment held %v, want bl-a's entries still there", bl.holders)
	}
	nc := getCleanup(t, "bl-a")
	if len(nc.Spec.Blocklisted) != 2 {
		t.Fatalf("blocklisted record: %+v", nc.Spec.Blocklisted)
	}
	for i, b := range nc.Spec.Blocklisted {
		if b.Address != addrs[i] || b.Volume != "vol-bl" || b.Reason != v1.ReasonNodeGone || b.BlocklistedAt.IsZero() {
			t.Errorf("record %d: %+v", i, b)
		}
	}
	if evs := drain(rec); !hasEvent(evs, fence.EventBlocklisted, "bl-a", addrs[0]) || !hasEvent(evs, fence.EventBroken) {
		t.Errorf("events %q", evs)
	}
}

// mustNotBreak wants node b's request refused as unavailable, with why in
// the error and in a FenceBlocklistFailed Event, node a's holds kept and no
// lock broken.
func mustNotBreak(t *testing.T, f *fence.Fencer, rec *record.FakeRecorder, volume, a, b, why string) {
	t.Helper()
	err := f.Acquire(ctxT(t), stageReq(volume, b, v1.ReadWriteOnce))
	if !errors.Is(err, volerr.ErrUnavailable) || !strings.Contains(err.Error(), why) {
		t.Fatalf("Acquire: %v, want unavailable: %s", err, why)
	}
	wantHolders(t, volume, a, a)
	if evs := drain(rec); !hasEvent(evs, fence.EventBlocklistFailed, a, why) || hasEvent(evs, fence.EventBroken) {
		t.Errorf("events %q", evs)
	}
}

func TestBreakRefusedWhileBlocklistingFails(t *testing.T) {
	bl := newFakeBlocklister()
	bl.setFail(errors.New("monitors unreachable"))
	f, rec := newCephFencer(t, bl)
	cleanupVolume(t, "vol-blfail", "blfail-a")
	mkNode(t, "blfail-a", corev1.Taint{Key: corev1.TaintNodeOutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute})
	mkNode(t, "blfail-b")
	stagedWithClients(t, "vol-blfail", "blfail-a", "10.0.0.2:0/1")
	mustNotBreak(t, f, rec, "vol-blfail", "blfail-a", "blfail-b", "monitors unreachable")

	// Ceph answers again: the retry breaks the lock.
	bl.setFail(nil)
	mustAcquire(t, f, stageReq("vol-blfail", "blfail-b", v1.ReadWriteOnce))
	wantHolders(t, "vol-blfail", "blfail-b")
	if !bl.isFenced("10.0.0.2:0/1") {
		t.Error("not blocklisted")
	}
	if nc := getCleanup(t, "blfail-a"); len(nc.Spec.Blocklisted) != 1 || nc.Spec.Blocklisted[0].Reason != v1.ReasonNodeOutOfService {
		t.Errorf("record %+v", nc.Spec.Blocklisted)
	}
}

func TestBreakRefusedWithoutBlocklister(t *testing.T) {
	f, rec := newFencer(t) // no Ceph access
	cleanupVolume(t, "vol-nobl", "nobl-a")
	mkNode(t, "nobl-b")
	stagedWithClients(t, "vol-nobl", "nobl-a", "10.0.0.3:0/1")
	mustNotBreak(t, f, rec, "vol-nobl", "nobl-a", "nobl-b", "no Ceph access")

	// A Fencer with Ceph access breaks the lock with it.
	bl := newFakeBlocklister()
	fc, _ := newCephFencer(t, bl)
	mustAcquire(t, fc, stageReq("vol-nobl", "nobl-b", v1.ReadWriteOnce))
	wantHolders(t, "vol-nobl", "nobl-b")
	if !bl.isFenced("10.0.0.3:0/1") {
		t.Error("the Fencer's Blocklister was not used")
	}
}

func TestGCLeavesGoneNodesCephEntriesWithoutBlocklister(t *testing.T) {
	suite.Require(t)
	cleanupVolume(t, "vol-gcbl", "gcbl-a")
	stagedWithClients(t, "vol-gcbl", "gcbl-a", "10.0.0.4:0/1") // gcbl-a: no Node object
	gc := func(bl fence.Blocklister) fence.GCResult {
		g, err := fence.NewGC(env.Client, clock.RealClock{}, testr.New(t), prometheus.NewRegistry(), fence.Options{Blocklister: bl})
		if err != nil {
			t.Fatal(err)
		}
		res, err := g.RunOnce(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	gc(nil)
	wantHolders(t, "vol-gcbl", "gcbl-a", "gcbl-a")

	bl := newFakeBlocklister()
	gc(bl)
	if !bl.isFenced("10.0.0.4:0/1") {
		t.Error("GC moved a gone node's entries without blocklisting its Ceph clients")
	}
	wantStale(t, "gcbl-a", "vol-gcbl", 2, v1.ReasonNodeGone)
	if nc := getCleanup(t, "gcbl-a"); len(nc.Spec.Blocklisted) != 1 {
		t.Errorf("record %+v", nc.Spec.Blocklisted)
	}
}

// TestEvictNodeFencesCephClients (F17): a StorageCluster deletion that
// stops waiting for a node moves its entries only after blocklisting the
// Ceph clients its Attachment status records, and records them on its
// stale list; without a Blocklister, or if blocklisting fails, nothing
// moves. Before, the entries moved unfenced: a node that was only cut off
// kept writing an image that outlives the deletion.
func TestEvictNodeFencesCephClients(t *testing.T) {
	suite.Require(t)
	mkNode(t, "evict-a")
	cleanupVolume(t, "vol-evict", "evict-a")
	stagedWithClients(t, "vol-evict", "evict-a", "10.0.0.21:0/7")
	clk, rec := clock.RealClock{}, record.NewFakeRecorder(100)

	if n, err := fence.EvictNode(ctxT(t), env.Client, clk, fence.Options{Events: rec}, "vol-evict", "evict-a", v1.ReasonClusterDeleted); err == nil || n != 0 {
		t.Fatalf("evict without a Blocklister: moved %d, err %v; want an error and nothing moved", n, err)
	}
	bl := newFakeBlocklister()
	bl.setFail(errors.New("ceph unreachable"))
	if _, err := fence.EvictNode(ctxT(t), env.Client, clk, fence.Options{Blocklister: bl}, "vol-evict", "evict-a", v1.ReasonClusterDeleted); !errors.Is(err, volerr.ErrUnavailable) {
		t.Fatalf("evict with blocklisting failing: %v, want unavailable", err)
	}
	if got := len(getAttachment(t, "vol-evict").Spec.Attachments); got != 2 {
		t.Fatalf("entries after failed evictions: %d, want 2 (nothing moved)", got)
	}

	bl.setFail(nil)
	n, err := fence.EvictNode(ctxT(t), env.Client, clk, fence.Options{Blocklister: bl, Events: rec}, "vol-evict", "evict-a", v1.ReasonClusterDeleted)
	if err != nil || n != 2 {
		t.Fatalf("evict: moved %d, %v; want 2", n, err)
	}
	if !bl.isFenced("10.0.0.21:0/7") {
		t.Fatal("the node's Ceph client was not blocklisted")
	}
	if holders := bl.holders[len(bl.holders)-1]; !slices.Contains(holders, "evict-a") {
		t.Fatalf("blocklisted after the entries left the Attachment (holders then: %v)", holders)
	}
	nc := getCleanup(t, "evict-a")
	if len(nc.Spec.Entries) != 2 || len(nc.Spec.Blocklisted) != 1 || nc.Spec.Blocklisted[0].Address != "10.0.0.21:0/7" {
		t.Fatalf("stale list: %+v", nc.Spec)
	}
	if !hasEvent(drain(rec), "FenceBlocklisted", "evict-a") {
		t.Error("no FenceBlocklisted Event")
	}
}

// TestBreakRefusedWithoutRecordedClients (F3): a node that holds a ceph
// volume's device with no Ceph client recorded (lost between its attach
// and its record) is not taken over while its Node stands, out-of-service
// or not: its client would write on, unfenced. Once it records them (its
// agent does at every start), the lock breaks with them fenced; a deleted
// Node's holds move as before. Before, the lock broke fencing nothing.
func TestBreakRefusedWithoutRecordedClients(t *testing.T) {
	bl := newFakeBlocklister()
	f, rec := newCephFencer(t, bl)
	cleanupVolume(t, "vol-norec", "norec-a")
	mkNode(t, "norec-a", corev1.Taint{Key: corev1.TaintNodeOutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute})
	mkNode(t, "norec-b")
	holdOn(t, "vol-norec", "norec-a", fakePod("norec-p"), v1.ReadWriteOnce) // no status: no client recorded
	err := f.Acquire(ctxT(t), stageReq("vol-norec", "norec-b", v1.ReadWriteOnce))
	if !fence.IsConflict(err) || !strings.Contains(err.Error(), "Ceph clients are not recorded") {
		t.Fatalf("take-over of a device holder without recorded clients: %v, want a conflict saying so", err)
	}
	wantHolders(t, "vol-norec", "norec-a", "norec-a")
	drain(rec)

	// Its agent records them: the lock breaks, fencing them first.
	fa, _ := newFencer(t)
	if err := fa.ReportStaged(ctxT(t), "vol-norec", fence.Staged{Node: "norec-a", DevicePath: "/dev/nbd1",
		StagingPath: stageReq("vol-norec", "norec-a", v1.ReadWriteOnce).StagingPath, CephClients: []string{"10.0.0.8:0/2"}}); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, f, stageReq("vol-norec", "norec-b", v1.ReadWriteOnce))
	wantHolders(t, "vol-norec", "norec-b")
	if !bl.isFenced("10.0.0.8:0/2") {
		t.Error("the recorded client was not blocklisted")
	}
}
