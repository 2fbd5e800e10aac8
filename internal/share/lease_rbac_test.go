package share_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/berth-io/berth/internal/share"
)

// TestShareManagerRoleCoversLease runs the share manager's Lease (create,
// renew, release, take over after a lapse) as a user that holds exactly the
// share-manager component's generated role, in the namespace the role names
// (the chart's release namespace): every call must be allowed, and Leases
// elsewhere, or other verbs, must not be.
func TestShareManagerRoleCoversLease(t *testing.T) {
	env := suite.Require(t)
	const ns = "berth-system"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(env.ComponentConfig(t, "share-manager", "berth-share-manager-rbac-test"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.CoordinationV1().Leases(ns).Delete(context.Background(), "pvc-rbac", metav1.DeleteOptions{})
	})
	newLease := func(holder string) *share.Lease {
		l, err := share.NewLease(share.LeaseConfig{Namespace: ns, Name: "pvc-rbac", Holder: holder, Duration: time.Second},
			cs.CoordinationV1(), clock.RealClock{}, testr.New(t))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}

	first := newLease("pod-1")
	if err := first.Acquire(ctx); err != nil {
		t.Fatalf("acquire (create) as the share manager: %v", err)
	}
	rctx, stop := context.WithTimeout(ctx, 2500*time.Millisecond)
	if err := first.Renew(rctx); err != nil && rctx.Err() == nil {
		t.Fatalf("renew as the share manager: %v", err)
	}
	stop()
	if err := first.Release(ctx); err != nil {
		t.Fatalf("release as the share manager: %v", err)
	}
	if err := newLease("pod-2").Acquire(ctx); err != nil {
		t.Fatalf("acquire a released Lease (get, update) as the share manager: %v", err)
	}
	l, err := admin.CoordinationV1().Leases(ns).Get(ctx, "pvc-rbac", metav1.GetOptions{})
	if err != nil || ptr.Deref(l.Spec.HolderIdentity, "") != "pod-2" {
		t.Fatalf("Lease holder after takeover: %v (err %v), want pod-2", l.Spec.HolderIdentity, err)
	}

	// Exactly: no Leases in other namespaces, no delete or list.
	other := l.DeepCopy()
	other.ObjectMeta = metav1.ObjectMeta{Name: "pvc-rbac", Namespace: "default"}
	if _, err := cs.CoordinationV1().Leases("default").Create(ctx, other, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("create a Lease in default as the share manager: %v, want forbidden", err)
	}
	if err := cs.CoordinationV1().Leases(ns).Delete(ctx, "pvc-rbac", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("delete a Lease as the share manager: %v, want forbidden", err)
	}
	if _, err := cs.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("list Leases as the share manager: %v, want forbidden", err)
	}
}
