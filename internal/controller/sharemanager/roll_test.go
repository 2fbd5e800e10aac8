package sharemanager_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/testenv"
)

// TestSharesMoveToNewImageOneAtATime: after an operator upgrade the
// running share-manager pods still run the old image (set here on the
// pods, as a new operator finds them). Each share moves to its
// ShareManager's image by a graceful delete of its pod, one share at a
// time: the second waits while the first starts again.
func TestSharesMoveToNewImageOneAtATime(t *testing.T) {
	suite.Require(t)
	k := kubelet{t}
	names := []string{"pvc-rwx-roll-a", "pvc-rwx-roll-b"}
	pods := map[string]*corev1.Pod{}
	for _, n := range names {
		newVolume(t, n, v1.VolumeModeFilesystem, "", v1.RWXSpec{LeaseDurationSeconds: ptr.To[int32](3)})
		useVolume(t, n, "web")
		pods[n] = sharePod(t, n, "")
		serve(t, k, n, pods[n], "node-a")
	}
	for _, n := range names {
		p := pods[n]
		p.Spec.Containers[0].Image = "berth.local/berth:old"
		if err := env.Client.Update(testCtx(t), p); err != nil {
			t.Fatalf("pod %s on the old image: %v", p.Name, err)
		}
	}

	var first, second string
	testenv.Eventually(t, waitLimit, "a share moving to the new image", func(ctx context.Context) (bool, error) {
		for i, n := range names {
			if terminating(ctx, t, pods[n]) {
				first, second = n, names[1-i]
				return true, nil
			}
		}
		return false, nil
	})
	sm := waitShare(t, first, v1.ShareStarting)
	if c := meta.FindStatusCondition(sm.Status.Conditions, v1.ConditionReady); c == nil || c.Reason != "Upgrading" {
		t.Errorf("moving share's Ready condition %+v, want reason Upgrading", c)
	}
	if sm.Status.Failovers != 0 {
		t.Errorf("a move to a new image counted %d failovers", sm.Status.Failovers)
	}
	time.Sleep(500 * time.Millisecond) // room for a second move to show
	if terminating(testCtx(t), t, pods[second]) {
		t.Fatalf("share %s moved while %s was starting again", second, first)
	}
	waitShare(t, second, v1.ShareRunning)

	// kubelet confirms the first pod gone: the share starts again on the
	// new image, and then the second moves.
	for _, n := range []string{first, second} {
		if n == second {
			testenv.Eventually(t, waitLimit, "share "+n+" moving", func(ctx context.Context) (bool, error) {
				return terminating(ctx, t, pods[n]), nil
			})
		}
		if err := env.Client.Delete(testCtx(t), pods[n], client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
			t.Fatal(err)
		}
		next := sharePod(t, n, pods[n].UID)
		if got := next.Spec.Containers[0].Image; got != opts.Image {
			t.Errorf("share %s started again on %s, want %s", n, got, opts.Image)
		}
		serve(t, k, n, next, "node-b")
	}
}

// terminating tells whether pod is being deleted (gracefully: no kubelet
// here confirms it).
func terminating(ctx context.Context, t *testing.T, pod *corev1.Pod) bool {
	t.Helper()
	p := &corev1.Pod{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pod), p); err != nil {
		return false
	}
	return p.UID == pod.UID && !p.DeletionTimestamp.IsZero()
}
