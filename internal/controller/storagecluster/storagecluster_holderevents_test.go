package storagecluster_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/controller/storagecluster"
)

// TestHolderDeletedEvents: a holder pod of a mover-mode cluster, deleted
// (bound to a node, it stays until its kubelet confirms, which envtest
// never does), gets one HolderDeleted Event on its node and one on its
// cluster, saying the node loses the storage network until the new
// holder's copy is made; a netns-mode holder's Event names what its
// namespace's volumes lose. A pod being deleted that is not a holder gets
// none.
func TestHolderDeletedEvents(t *testing.T) {
	suite.Require(t)
	node(t, "hd-n1")
	mover := newCluster(t, "hd-mover", v1.StorageClusterSpec{DataDir: "/srv/hd-mover", Network: v1.NetworkSpec{
		Provider: v1.NetworkProviderMultus, Selectors: &v1.NetworkSelectors{Public: "storage-net/public"},
		Multus: &v1.MultusSpec{Mode: v1.MultusModeMover},
	}})
	netns := newCluster(t, "hd-netns", v1.StorageClusterSpec{DataDir: "/srv/hd-netns", Network: v1.NetworkSpec{
		Provider: v1.NetworkProviderMultus, Selectors: &v1.NetworkSelectors{Public: "storage-net/public"},
	}})

	deletedPod(t, "holder-hd-mover-x", map[string]string{
		"app.kubernetes.io/name": "berth", "app.kubernetes.io/instance": mover.Name,
		"app.kubernetes.io/component": "holder", "app.kubernetes.io/managed-by": "berth-operator",
	})
	deletedPod(t, "holder-hd-netns-x", map[string]string{
		"app.kubernetes.io/name": "berth", "app.kubernetes.io/instance": netns.Name,
		"app.kubernetes.io/component": "holder", "app.kubernetes.io/managed-by": "berth-operator",
	})
	deletedPod(t, "not-a-holder", map[string]string{"app.kubernetes.io/instance": mover.Name, "app.kubernetes.io/component": "agent"})

	onNode := waitHolderEvents(t, "hd-n1", 2)
	onMover := waitHolderEvents(t, mover.Name, 1)
	onNetns := waitHolderEvents(t, netns.Name, 1)
	for _, want := range []string{"holder pod holder-hd-mover-x of StorageCluster hd-mover on node hd-n1", "the mover removes its copy",
		"no storage-net/public storage network", "until the new holder runs"} {
		if !strings.Contains(onMover[0].Message, want) {
			t.Errorf("mover-mode Event %q lacks %q", onMover[0].Message, want)
		}
	}
	if !strings.Contains(onNetns[0].Message, "holder-hd-netns-x") || !strings.Contains(onNetns[0].Message, "until they are staged again") {
		t.Errorf("netns-mode Event %q", onNetns[0].Message)
	}
	for _, e := range append(onNode, onMover...) {
		if e.Count > 1 || e.Type != corev1.EventTypeWarning || strings.Contains(e.Message, "not-a-holder") {
			t.Errorf("Event %s: %s x%d: %q", e.InvolvedObject.Name, e.Type, e.Count, e.Message)
		}
	}
}

// deletedPod creates a pod bound to node hd-n1 with labels in the
// operator's namespace and deletes it; the test's end removes it for good.
func deletedPod(t *testing.T, name string, labels map[string]string) {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels},
		Spec:       corev1.PodSpec{NodeName: "hd-n1", Containers: []corev1.Container{{Name: "c", Image: "berth.local/berth:test"}}},
	}
	create(t, p)
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), p, client.GracePeriodSeconds(0))
	})
	if err := env.Client.Delete(testCtx(t), p, client.GracePeriodSeconds(30)); err != nil {
		t.Fatal(err)
	}
}

// waitHolderEvents waits for n HolderDeleted Events of the object named
// name and returns them.
func waitHolderEvents(t *testing.T, name string, n int) []corev1.Event {
	t.Helper()
	var evs corev1.EventList
	eventually(t, "HolderDeleted Events of "+name, func(ctx context.Context) (bool, error) {
		err := env.Client.List(ctx, &evs, client.MatchingFields{"involvedObject.name": name, "reason": storagecluster.ReasonHolderDeleted})
		return len(evs.Items) == n, err
	})
	return evs.Items
}
