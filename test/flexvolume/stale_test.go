package flexvolume

import (
	"context"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
	flex "github.com/berth-io/berth/internal/flexvolume"
)

// TestStaleListAfterRestart: while the agent is down, its node is marked
// out of service and another node takes the volume over (lock breaking moves
// this node's entries to its stale list). When the agent starts again it
// works through the list: the pod's mount and the staging mount are gone
// and the loop device detached.
func TestStaleListAfterRestart(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	image := f.volume(t, "flex", "stale-a", v1.ReadWriteOnce)
	uid := f.pod(t, podSpec{ns: "default", name: "pod-e", volume: inline("stale-a", "")})
	dir := f.podDir(uid, "stale-a")
	res, _ := f.run(t, "mount", dir, options(t, "pod-e", uid, "stale-a"))
	want(t, "mount", res, flex.StatusSuccess)

	agentBack := f.agentDown(t, syscall.SIGTERM)
	if !mounted(t, dir) || loops(t, image) != 1 {
		t.Fatal("stopping the agent should leave the volume mounted")
	}

	// The node goes out of service; another node takes the volume.
	setTaint(t, f, true)
	other := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "other-node"}}
	if err := f.env.Client.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.env.Client.Delete(ctx, other) })
	fencer := fence.New(f.env.Client, record.NewFakeRecorder(16), clock.RealClock{}, testLogger(t), fence.Options{})
	staging := filepath.Join(f.dir, "other-staging", "stale-a")
	req := fence.Request{Volume: "stale-a", Node: "other-node", MountDir: staging, StagingPath: staging, AccessMode: v1.ReadWriteOnce}
	if err := fencer.Acquire(ctx, req); err != nil {
		t.Fatalf("takeover by another node: %v", err)
	}
	t.Cleanup(func() { _ = fencer.Release(ctx, "stale-a", "other-node", staging) })
	nc := &v1.NodeCleanup{}
	if err := f.env.Client.Get(ctx, client.ObjectKey{Name: node}, nc); err != nil || len(nc.Spec.Entries) != 2 {
		t.Fatalf("stale list of %s after the takeover: %+v (%v), want the stage record and the pod's mount", node, nc.Spec.Entries, err)
	}

	// The node comes back; its agent starts and works through the list.
	setTaint(t, f, false)
	agentBack()
	waitFor(t, "the stale list to be worked through", func() bool {
		return f.env.Client.Get(ctx, client.ObjectKey{Name: node}, nc) == nil && len(nc.Spec.Entries) == 0
	})
	if mounted(t, dir) {
		t.Error("the pod's mount is still there")
	}
	if n := loops(t, image); n != 0 {
		t.Errorf("%d loop devices left on the image", n)
	}
	t.Logf("stale list done: pending %d, last processed %v", nc.Status.Pending, nc.Status.LastProcessed)
}

func setTaint(t *testing.T, f *fixture, on bool) {
	t.Helper()
	n := &corev1.Node{}
	if err := f.env.Client.Get(context.Background(), client.ObjectKey{Name: node}, n); err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = nil
	if on {
		n.Spec.Taints = []corev1.Taint{{Key: "node.kubernetes.io/out-of-service", Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}}
	}
	if err := f.env.Client.Update(context.Background(), n); err != nil {
		t.Fatal(err)
	}
}

func testLogger(t *testing.T) logr.Logger { return testr.New(t) }
