package sharemanager_test

import (
	"context"
	"testing"

	"github.com/go-logr/logr/testr"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/controller/sharemanager"
	"github.com/berth-io/berth/internal/testenv"
)

// TestOperatorRoleCoversShares runs both reconcilers as a user that holds
// exactly the operator's generated roles, through a share's whole life:
// ShareManager made and mirrored, pod, claim, PersistentVolume and Service
// made, a failed pod force-deleted and the Volume's remountRequestedAt set,
// the pod deleted once no workload needs it. Every call they make must be
// allowed. (The running controllers of the suite work in another namespace.)
func TestOperatorRoleCoversShares(t *testing.T) {
	suite.Require(t)
	const vname = "pvc-rwx-rbac"
	c := env.ComponentClient(t, "operator", "berth-operator-share-rbac-test")
	o := opts
	o.Namespace = roleNamespace
	vr := &sharemanager.VolumeReconciler{Client: c, Options: o, Log: testr.New(t)}
	r := &sharemanager.Reconciler{Client: c, Options: o, Clock: clk, Log: testr.New(t)}
	vol := newVolume(t, vname, v1.VolumeModeFilesystem, "", v1.RWXSpec{LeaseDurationSeconds: ptr.To[int32](3)})
	smKey := client.ObjectKey{Namespace: roleNamespace, Name: vname}
	podKey := client.ObjectKey{Namespace: roleNamespace, Name: sharemanager.Name(vname)}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = env.Client.Delete(ctx, &v1.ShareManager{ObjectMeta: metav1.ObjectMeta{Name: vname, Namespace: roleNamespace}})
		_ = env.Client.Delete(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: podKey.Name, Namespace: roleNamespace}})
		_ = env.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podKey.Name, Namespace: roleNamespace}}, client.GracePeriodSeconds(0))
	})
	reconcile := func(what string) {
		t.Helper()
		if _, err := vr.Reconcile(testCtx(t), ctrl.Request{NamespacedName: client.ObjectKey{Name: vname}}); err != nil {
			t.Fatalf("%s: volume reconcile as the operator: %v", what, err)
		}
		if _, err := r.Reconcile(testCtx(t), ctrl.Request{NamespacedName: smKey}); err != nil {
			t.Fatalf("%s: share reconcile as the operator: %v", what, err)
		}
	}
	state := func(want v1.ShareState) {
		t.Helper()
		sm := &v1.ShareManager{}
		if err := env.Client.Get(testCtx(t), smKey, sm); err != nil || sm.Status.State != want {
			t.Fatalf("ShareManager state %q (err %v), want %s", sm.Status.State, err, want)
		}
	}

	reconcile("no workload")
	state(v1.ShareStopped)
	reconcile("mirror")
	useVolume(t, vname, "web-r")
	reconcile("a workload")
	state(v1.ShareStarting)
	pod := &corev1.Pod{}
	env.WaitGet(t, waitLimit, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: podKey.Name, Namespace: roleNamespace}})
	if err := env.Client.Get(testCtx(t), podKey, pod); err != nil {
		t.Fatal(err)
	}
	kubelet{t}.bind(pod, "node-a")
	kubelet{t}.status(pod, corev1.PodFailed, false)
	reconcile("pod failed")
	state(v1.ShareError)
	if remountRequestedAt(t, vol.Name).IsZero() {
		t.Error("remountRequestedAt not set")
	}
	testenv.Eventually(t, waitLimit, "failed pod gone", func(ctx context.Context) (bool, error) {
		p := &corev1.Pod{}
		err := env.Client.Get(ctx, podKey, p)
		return client.IgnoreNotFound(err) == nil && (err != nil || p.UID != pod.UID), client.IgnoreNotFound(err)
	})
	reconcile("replace")
	state(v1.ShareStarting)
	if err := env.Client.Get(testCtx(t), podKey, pod); err != nil {
		t.Fatalf("replacement pod: %v", err)
	}
	useVolume(t, vname, "")
	reconcile("no workload again")
	state(v1.ShareStopping)

	// Exactly: pods and claims elsewhere are out of reach.
	elsewhere := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: namespace}}
	if err := c.Delete(testCtx(t), elsewhere); !apierrors.IsForbidden(err) {
		t.Errorf("delete a pod in %s as the operator: %v, want forbidden", namespace, err)
	}
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: namespace}}
	if err := c.Create(testCtx(t), claim); !apierrors.IsForbidden(err) {
		t.Errorf("create a claim in %s as the operator: %v, want forbidden", namespace, err)
	}
}
