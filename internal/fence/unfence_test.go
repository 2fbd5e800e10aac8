package fence_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
)

// readyNode makes a Ready node (envtest has no kubelet to say so).
func readyNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n := mkNode(t, name)
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
	if err := env.Client.Status().Update(ctxT(t), n); err != nil {
		t.Fatal(err)
	}
	return n
}

// cleanedPass writes what the node's Cleaner writes after a pass with
// nothing left.
func cleanedPass(t *testing.T, node string, at time.Time) {
	t.Helper()
	nc := getCleanup(t, node)
	nc.Spec.Entries = nil
	if err := env.Client.Update(ctxT(t), nc); err != nil {
		t.Fatal(err)
	}
	lp := metav1.NewTime(at)
	nc.Status.LastProcessed = &lp
	nc.Status.Conditions = []metav1.Condition{{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Processed", LastTransitionTime: lp}}
	if err := env.Client.Status().Update(ctxT(t), nc); err != nil {
		t.Fatal(err)
	}
}

// fencedOff has node b take volume over from node a (gone), whose Ceph
// client addr is blocklisted on the way.
func fencedOff(t *testing.T, volume, a, b, addr string) *fakeBlocklister {
	t.Helper()
	bl := newFakeBlocklister()
	f, _ := newCephFencer(t, bl)
	cleanupVolume(t, volume, a)
	mkNode(t, b)
	stagedWithClients(t, volume, a, addr)
	mustAcquire(t, f, stageReq(volume, b, v1.ReadWriteOnce))
	if !bl.isFenced(addr) {
		t.Fatalf("%s not blocklisted", addr)
	}
	return bl
}

func TestUnfenceAfterNodeBackCleanedAndCooldown(t *testing.T) {
	bl := fencedOff(t, "vol-unbl", "unbl-a", "unbl-b", "10.0.0.5:0/1")

	clk := clocktesting.NewFakeClock(time.Now())
	rec := record.NewFakeRecorder(100)
	u := fence.NewUnfencer(env.Client, bl, rec, clk, testr.New(t), fence.UnfenceOptions{Cooldown: 5 * time.Minute})
	pass := func(want int) {
		t.Helper()
		n, err := u.RunOnce(ctxT(t))
		if err != nil || n != want {
			t.Fatalf("unfence pass: %d, %v; want %d", n, err, want)
		}
	}
	mark := func() string { return getCleanup(t, "unbl-a").Annotations[fence.NodeCleanSinceAnnotation] }

	// Node gone; then back but not cleaned: nothing moves.
	pass(0)
	readyNode(t, "unbl-a")
	pass(0)
	if mark() != "" {
		t.Fatal("marked before the node's stale entries were undone")
	}
	// Cleaned: marked, and the cool-down starts.
	cleanedPass(t, "unbl-a", clk.Now().Add(time.Second))
	clk.Step(2 * time.Second)
	pass(0)
	if mark() == "" {
		t.Fatal("no clean-since mark")
	}
	clk.Step(4 * time.Minute)
	pass(0)
	if !bl.isFenced("10.0.0.5:0/1") {
		t.Fatal("unfenced before the cool-down")
	}

	// Unblocklisting fails: the record stays, with an Event.
	bl.setFail(errors.New("caps insufficient"))
	clk.Step(2 * time.Minute)
	if _, err := u.RunOnce(ctxT(t)); err == nil || !strings.Contains(err.Error(), "caps insufficient") {
		t.Fatalf("unfence with Ceph failing: %v", err)
	}
	if evs := drain(rec); !hasEvent(evs, fence.EventUnblocklistFailed, "unbl-a") {
		t.Errorf("events %q", evs)
	}
	if len(getCleanup(t, "unbl-a").Spec.Blocklisted) != 1 {
		t.Fatal("record dropped though unblocklisting failed")
	}
	bl.setFail(nil)
	pass(1)
	if bl.isFenced("10.0.0.5:0/1") {
		t.Error("still blocklisted")
	}
	nc := getCleanup(t, "unbl-a")
	if len(nc.Spec.Blocklisted) != 0 || nc.Annotations[fence.NodeCleanSinceAnnotation] != "" {
		t.Errorf("record or mark left: %+v %v", nc.Spec.Blocklisted, nc.Annotations)
	}
	if evs := drain(rec); !hasEvent(evs, fence.EventUnblocklisted, "unbl-a", "10.0.0.5:0/1") {
		t.Errorf("events %q", evs)
	}
	pass(0)
}

func TestUnfenceCooldownRestartsWhenNodeLeavesAgain(t *testing.T) {
	bl := fencedOff(t, "vol-flap", "flap-a", "flap-b", "10.0.0.6:0/1")
	clk := clocktesting.NewFakeClock(time.Now())
	u := fence.NewUnfencer(env.Client, bl, record.NewFakeRecorder(100), clk, testr.New(t), fence.UnfenceOptions{})
	n := readyNode(t, "flap-a")
	cleanedPass(t, "flap-a", clk.Now().Add(time.Second))
	clk.Step(2 * time.Second)
	if _, err := u.RunOnce(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	// Tainted out-of-service again within the cool-down: the mark goes.
	n.Spec.Taints = []corev1.Taint{{Key: corev1.TaintNodeOutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}}
	if err := env.Client.Update(ctxT(t), n); err != nil {
		t.Fatal(err)
	}
	clk.Step(fence.DefaultUnfenceCooldown)
	if got, err := u.RunOnce(ctxT(t)); err != nil || got != 0 {
		t.Fatalf("unfence pass: %d, %v", got, err)
	}
	if getCleanup(t, "flap-a").Annotations[fence.NodeCleanSinceAnnotation] != "" || !bl.isFenced("10.0.0.6:0/1") {
		t.Error("cool-down not restarted")
	}
}
