package fence_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
)

// askingFencer is the agent's Fencer: it asks the operator to break locks.
func askingFencer(t *testing.T, wait time.Duration) *fence.Fencer {
	t.Helper()
	_, _ = newFencer(t) // requires the suite
	return fence.New(env.Client, record.NewFakeRecorder(100), clock.RealClock{}, testr.New(t),
		fence.Options{AskOperator: true, TakeOverWait: wait})
}

// serveUntil runs the operator's side until acquire returns.
func serveUntil(t *testing.T, op *fence.Fencer, volume string, acquire func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- acquire() }()
	for {
		select {
		case err := <-done:
			return err
		case <-time.After(100 * time.Millisecond):
			if _, err := op.ServeTakeOvers(ctxT(t), volume, nil); err != nil {
				t.Errorf("serve take-overs: %v", err)
			}
		}
	}
}

// TestTakeOverThroughTheOperator (F4): the agent's Fencer never removes
// another node's hold; it asks, and the operator breaks the lock once its
// own reading of the Node allows it.
func TestTakeOverThroughTheOperator(t *testing.T) {
	agent := askingFencer(t, 10*time.Second)
	op, _ := newFencer(t)
	cleanupVolume(t, "vol-ask", "ask-a", "ask-b")
	a := mkNode(t, "ask-a")
	mkNode(t, "ask-b")
	holdOn(t, "vol-ask", "ask-a", fakePod("ask-p1"), v1.ReadWriteOnce)

	// A live holder: refused at once, and nothing asked.
	mustConflict(t, agent.Acquire(ctxT(t), stageReq("vol-ask", "ask-b", v1.ReadWriteOnce)), "ask-a", "")
	if got := getAttachment(t, "vol-ask"); len(got.Spec.TakeOvers) != 0 {
		t.Fatalf("take-over asked of a live holder: %+v", got.Spec.TakeOvers)
	}

	// A lying agent writes a request anyway (the policy lets it write its
	// own): the operator reads the Node itself and breaks nothing.
	att := getAttachment(t, "vol-ask")
	req := stageReq("vol-ask", "ask-b", v1.ReadWriteOnce)
	att.Spec.TakeOvers = []v1.TakeOverRequest{{AttachmentEntry: v1.AttachmentEntry{Node: "ask-b", MountDir: req.MountDir, StagingPath: req.StagingPath},
		AccessMode: v1.ReadWriteOnce, RequestedAt: metav1.Now()}}
	if err := env.Client.Update(ctxT(t), att); err != nil {
		t.Fatal(err)
	}
	pending, err := op.ServeTakeOvers(ctxT(t), "vol-ask", nil)
	if err != nil || !pending {
		t.Fatalf("serve a request the rules refuse: pending %v, err %v; want pending, no error", pending, err)
	}
	wantHolders(t, "vol-ask", "ask-a", "ask-a")

	// ask-a is declared lost: the agent asks, the operator breaks.
	a.Spec.Taints = []corev1.Taint{{Key: corev1.TaintNodeOutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}}
	if err := env.Client.Update(ctxT(t), a); err != nil {
		t.Fatal(err)
	}
	if err := serveUntil(t, op, "vol-ask", func() error { return agent.Acquire(ctxT(t), req) }); err != nil {
		t.Fatalf("acquire through the operator: %v", err)
	}
	wantHolders(t, "vol-ask", "ask-b")
	wantStale(t, "ask-a", "vol-ask", 2, v1.ReasonNodeOutOfService)
	if got := getAttachment(t, "vol-ask"); len(got.Spec.TakeOvers) != 0 {
		t.Errorf("request left after the take-over: %+v", got.Spec.TakeOvers)
	}
	if pending, err := op.ServeTakeOvers(ctxT(t), "vol-ask", nil); err != nil || pending {
		t.Errorf("serve with nothing asked: pending %v, err %v", pending, err)
	}
}

// TestTakeOverWaitsThenConflicts: with no operator to answer, the agent
// returns a conflict that says it waits for the operator, and the request
// stays for it.
func TestTakeOverWaitsThenConflicts(t *testing.T) {
	agent := askingFencer(t, 500*time.Millisecond)
	cleanupVolume(t, "vol-nobody", "nobody-a")
	mkNode(t, "nobody-b")
	holdOn(t, "vol-nobody", "nobody-a", fakePod("nobody-p1"), v1.ReadWriteOnce) // nobody-a has no Node object
	req := stageReq("vol-nobody", "nobody-b", v1.ReadWriteOnce)
	err := agent.Acquire(ctxT(t), req)
	mustConflict(t, err, "nobody-a", "")
	if !strings.Contains(err.Error(), "operator") {
		t.Errorf("conflict %q does not say it waits for the operator", err)
	}
	got := getAttachment(t, "vol-nobody")
	if len(got.Spec.TakeOvers) != 1 || got.Spec.TakeOvers[0].Node != "nobody-b" {
		t.Fatalf("requests after the wait: %+v, want nobody-b's", got.Spec.TakeOvers)
	}
	wantHolders(t, "vol-nobody", "nobody-a", "nobody-a")
	// Unstaging drops the request with the hold that was never granted.
	if err := agent.Release(ctxT(t), "vol-nobody", "nobody-b", req.MountDir); err != nil {
		t.Fatal(err)
	}
	if got := getAttachment(t, "vol-nobody"); len(got.Spec.TakeOvers) != 0 {
		t.Errorf("requests after release: %+v", got.Spec.TakeOvers)
	}
}

// TestTakeOverRequestsExpire: the operator drops a request nobody renewed.
func TestTakeOverRequestsExpire(t *testing.T) {
	_, _ = newFencer(t)
	clk := clocktesting.NewFakeClock(time.Now())
	op := fence.New(env.Client, record.NewFakeRecorder(100), clk, testr.New(t), fence.Options{})
	cleanupVolume(t, "vol-expire", "expire-a")
	mkNode(t, "expire-a")
	holdOn(t, "vol-expire", "expire-a", fakePod("expire-p1"), v1.ReadWriteOnce)
	att := getAttachment(t, "vol-expire")
	att.Spec.TakeOvers = []v1.TakeOverRequest{{AttachmentEntry: v1.AttachmentEntry{Node: "expire-b", MountDir: "/var/lib/kubelet/plugins/berth.io/staging/vol-expire"},
		AccessMode: v1.ReadWriteOnce, RequestedAt: metav1.NewTime(clk.Now())}}
	if err := env.Client.Update(context.Background(), att); err != nil {
		t.Fatal(err)
	}
	if pending, err := op.ServeTakeOvers(ctxT(t), "vol-expire", nil); err != nil || !pending {
		t.Fatalf("fresh request: pending %v, err %v", pending, err)
	}
	clk.Step(fence.TakeOverExpiry + time.Second)
	if pending, err := op.ServeTakeOvers(ctxT(t), "vol-expire", nil); err != nil || pending {
		t.Fatalf("expired request: pending %v, err %v", pending, err)
	}
	if got := getAttachment(t, "vol-expire"); len(got.Spec.TakeOvers) != 0 {
		t.Errorf("requests after expiry: %+v", got.Spec.TakeOvers)
	}
	wantHolders(t, "vol-expire", "expire-a", "expire-a")
}

// TestBrokenAttachmentWithExpiredRequestIsDeleted: the operator broke
// every hold for a request whose agent never came back; once the request
// expires, the empty Attachment goes.
func TestBrokenAttachmentWithExpiredRequestIsDeleted(t *testing.T) {
	_, _ = newFencer(t)
	clk := clocktesting.NewFakeClock(time.Now())
	op := fence.New(env.Client, record.NewFakeRecorder(100), clk, testr.New(t), fence.Options{})
	cleanupVolume(t, "vol-gone-asker", "gone-asker-a")
	holdOn(t, "vol-gone-asker", "gone-asker-a", fakePod("gone-asker-p1"), v1.ReadWriteOnce) // no Node object: gone
	att := getAttachment(t, "vol-gone-asker")
	att.Spec.TakeOvers = []v1.TakeOverRequest{{AttachmentEntry: v1.AttachmentEntry{Node: "gone-asker-b", MountDir: "/var/lib/kubelet/plugins/berth.io/staging/vol-gone-asker"},
		AccessMode: v1.ReadWriteOnce, RequestedAt: metav1.NewTime(clk.Now())}}
	if err := env.Client.Update(context.Background(), att); err != nil {
		t.Fatal(err)
	}
	if _, err := op.ServeTakeOvers(ctxT(t), "vol-gone-asker", nil); err != nil {
		t.Fatal(err)
	}
	wantHolders(t, "vol-gone-asker")
	clk.Step(fence.TakeOverExpiry + time.Second)
	if pending, err := op.ServeTakeOvers(ctxT(t), "vol-gone-asker", nil); err != nil || pending {
		t.Fatalf("expired request: pending %v, err %v", pending, err)
	}
	var gone v1.Attachment
	if err := env.Client.Get(ctxT(t), client.ObjectKey{Name: "vol-gone-asker"}, &gone); !apierrors.IsNotFound(err) {
		t.Errorf("the empty Attachment after the request expired: %v (%+v)", err, gone.Spec)
	}
}

// TestAskingFencerRefusesUnrecordedCephHolder: the agent's Fencer has no
// Ceph access (the operator fences), so Request.Ceph tells it a volume is
// on Ceph. It then asks no take-over of a device holder whose clients are
// not recorded (the operator could not fence them) and says why at once;
// a volume not on Ceph is asked for.
func TestAskingFencerRefusesUnrecordedCephHolder(t *testing.T) {
	agent := askingFencer(t, 300*time.Millisecond)
	cleanupVolume(t, "vol-askceph", "askceph-a")
	mkNode(t, "askceph-a", corev1.Taint{Key: corev1.TaintNodeOutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute})
	mkNode(t, "askceph-b")
	holdOn(t, "vol-askceph", "askceph-a", fakePod("askceph-p"), v1.ReadWriteOnce) // no status: no client recorded

	req := stageReq("vol-askceph", "askceph-b", v1.ReadWriteOnce)
	req.Ceph = true
	if err := agent.Acquire(ctxT(t), req); !fence.IsConflict(err) || !strings.Contains(err.Error(), "Ceph clients are not recorded") {
		t.Fatalf("ceph volume: %v, want a conflict saying the clients are not recorded", err)
	}
	if got := getAttachment(t, "vol-askceph").Spec.TakeOvers; len(got) != 0 {
		t.Fatalf("take-over asked for a holder that cannot be fenced: %+v", got)
	}
	req.Ceph = false
	if err := agent.Acquire(ctxT(t), req); !fence.IsConflict(err) || !strings.Contains(err.Error(), "waited") {
		t.Fatalf("volume not on ceph: %v, want a conflict after waiting for the operator", err)
	}
	if got := getAttachment(t, "vol-askceph").Spec.TakeOvers; len(got) != 1 || got[0].Node != "askceph-b" {
		t.Errorf("take-over requests %+v, want askceph-b's", got)
	}
}
