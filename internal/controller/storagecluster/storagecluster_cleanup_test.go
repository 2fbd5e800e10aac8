package storagecluster_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/controller/storagecluster"
)

// create makes obj and removes it at the end of the test.
func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := env.Client.Create(testCtx(t), obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
	t.Cleanup(func() {
		if err := env.Client.Delete(context.Background(), obj); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete %T %s: %v", obj, obj.GetName(), err)
		}
	})
}

func node(t *testing.T, name string) {
	create(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
}

// attachedVolume makes a Volume of cluster with an Attachment entry per node.
func attachedVolume(t *testing.T, name, cluster string, nodes ...string) {
	create(t, &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.VolumeSpec{
		StorageCluster: cluster, Size: resource.MustParse("1Gi"), Node: nodes[0],
	}})
	att := &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.AttachmentSpec{AccessMode: v1.ReadWriteMany}}
	for _, n := range nodes {
		att.Spec.Attachments = append(att.Spec.Attachments, v1.AttachmentEntry{Node: n, MountDir: "/var/lib/kubelet/plugins/staging/" + name})
	}
	create(t, att)
}

func TestPendingCleanup(t *testing.T) {
	suite.Require(t)
	node(t, "pc-n1")
	node(t, "pc-n2")
	node(t, "pc-n3")
	attachedVolume(t, "pc-v1", "pc", "pc-n1", "pc-n2")
	attachedVolume(t, "pc-v2", "pc", "pc-n2", "pc-gone") // pc-gone has no Node object
	attachedVolume(t, "pc-other", "other", "pc-n3")      // another cluster's volume
	create(t, &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "pc-v3"}, Spec: v1.VolumeSpec{
		StorageCluster: "pc", Size: resource.MustParse("1Gi"), // never attached
	}})

	sc := &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "pc"}, Spec: v1.StorageClusterSpec{CleanupPolicy: v1.CleanupDetach}}
	for _, tc := range []struct {
		name    string
		policy  v1.CleanupPolicy
		cleaned []string
		want    []string
	}{
		{"nobody reported", v1.CleanupDetach, nil, []string{"pc-n1", "pc-n2"}},
		{"one reported", v1.CleanupDetach, []string{"pc-n2"}, []string{"pc-n1"}},
		{"all reported", v1.CleanupDetach, []string{"pc-n1", "pc-n2"}, nil},
		{"retain waits for none", v1.CleanupRetain, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc.Spec.CleanupPolicy, sc.Status.CleanedNodes = tc.policy, tc.cleaned
			got, err := storagecluster.PendingCleanup(testCtx(t), env.Client, sc)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("pending %v, want %v", got, tc.want)
			}
		})
	}
}

func TestStorageClusterDeletionDetachWaitsForNodes(t *testing.T) {
	suite.Require(t)
	node(t, "del-n1")
	attachedVolume(t, "del-v1", "epsilon", "del-n1", "del-gone")
	sc := newCluster(t, "epsilon", v1.StorageClusterSpec{})
	deleteOnceFinalized(t, sc)
	eventually(t, "phase Deleting naming del-n1 only", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(sc), sc)
		return sc.Status.Phase == v1.StorageClusterDeleting, err
	})
	waitCondition(t, sc, v1.ConditionReady, metav1.ConditionFalse, storagecluster.ReasonDeleting)
	if msg := readyMessage(sc); msg != "waiting for the agents of nodes del-n1 to detach this cluster's volumes" {
		t.Errorf("Ready message %q", msg)
	}

	// The agent of del-n1 reports (issue 5's agents do this).
	patch := client.MergeFrom(sc.DeepCopy())
	sc.Status.CleanedNodes = []string{"del-n1"}
	if err := env.Client.Status().Patch(testCtx(t), sc, patch); err != nil {
		t.Fatal(err)
	}
	gone(t, sc)
}

func TestStorageClusterDeletionDetachNodeGone(t *testing.T) {
	suite.Require(t)
	create(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dg-n1"}})
	attachedVolume(t, "dg-v1", "zeta", "dg-n1")
	sc := newCluster(t, "zeta", v1.StorageClusterSpec{})
	deleteOnceFinalized(t, sc)
	waitCondition(t, sc, v1.ConditionReady, metav1.ConditionFalse, storagecluster.ReasonDeleting)
	// The node goes away without reporting: nobody is left to wait for.
	if err := env.Client.Delete(testCtx(t), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dg-n1"}}); err != nil {
		t.Fatal(err)
	}
	gone(t, sc)
}

// TestStorageClusterDeletionDetachTimesOut: a node whose agent never reports
// (down) does not hold the deletion past spec.cleanupTimeout: its entries on
// the cluster's volumes move to its stale list (reason ClusterDeleted), the
// cluster goes, and an Event says so. Another cluster's volume on the same
// node stays held.
func TestStorageClusterDeletionDetachTimesOut(t *testing.T) {
	suite.Require(t)
	node(t, "to-n1")
	attachedVolume(t, "to-v1", "theta", "to-n1")
	attachedVolume(t, "to-other", "iota", "to-n1")
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &v1.NodeCleanup{ObjectMeta: metav1.ObjectMeta{Name: "to-n1"}})
	})
	sc := newCluster(t, "theta", v1.StorageClusterSpec{CleanupTimeout: &metav1.Duration{Duration: 2 * time.Second}})
	deleteOnceFinalized(t, sc)
	waitCondition(t, sc, v1.ConditionReady, metav1.ConditionFalse, storagecluster.ReasonDeleting)
	gone(t, sc)
	nc := &v1.NodeCleanup{}
	if err := env.Client.Get(testCtx(t), client.ObjectKey{Name: "to-n1"}, nc); err != nil {
		t.Fatalf("stale list of to-n1: %v", err)
	}
	if len(nc.Spec.Entries) != 1 || nc.Spec.Entries[0].Volume != "to-v1" || nc.Spec.Entries[0].Reason != v1.ReasonClusterDeleted {
		t.Errorf("stale list %+v, want to-v1 with reason ClusterDeleted", nc.Spec.Entries)
	}
	if err := env.Client.Get(testCtx(t), client.ObjectKey{Name: "to-v1"}, &v1.Attachment{}); !apierrors.IsNotFound(err) {
		t.Errorf("Attachment to-v1 after the timeout: %v, want gone", err)
	}
	other := &v1.Attachment{}
	if err := env.Client.Get(testCtx(t), client.ObjectKey{Name: "to-other"}, other); err != nil || len(other.Spec.Attachments) != 1 {
		t.Errorf("another cluster's Attachment: %+v %v, want untouched", other.Spec.Attachments, err)
	}
	eventually(t, "a CleanupTimedOut Event", func(ctx context.Context) (bool, error) {
		var evs corev1.EventList
		err := env.Client.List(ctx, &evs, client.MatchingFields{"involvedObject.name": "theta", "reason": storagecluster.EventCleanupTimedOut})
		return len(evs.Items) == 1 && strings.Contains(evs.Items[0].Message, "to-n1"), err
	})
}

func TestStorageClusterDeletionRetain(t *testing.T) {
	suite.Require(t)
	node(t, "ret-n1")
	attachedVolume(t, "ret-v1", "eta", "ret-n1")
	sc := newCluster(t, "eta", v1.StorageClusterSpec{CleanupPolicy: v1.CleanupRetain})
	deleteOnceFinalized(t, sc)
	gone(t, sc)
}

// deleteOnceFinalized deletes sc once the operator has put its finalizer on.
func deleteOnceFinalized(t *testing.T, sc *v1.StorageCluster) {
	t.Helper()
	eventually(t, "finalizer added", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(sc), sc)
		return slices.Contains(sc.Finalizers, storagecluster.Finalizer), err
	})
	if err := env.Client.Delete(testCtx(t), sc); err != nil {
		t.Fatal(err)
	}
}

func readyMessage(sc *v1.StorageCluster) string {
	for _, c := range sc.Status.Conditions {
		if c.Type == v1.ConditionReady {
			return c.Message
		}
	}
	return ""
}
