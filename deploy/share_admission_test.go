package deploy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	coordinationv1 "k8s.io/api/coordination/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-io/berth/internal/controller/sharemanager"
	"github.com/berth-io/berth/internal/share"
)

const (
	shareManagerUser = "system:serviceaccount:" + releaseNamespace + ":berth-share-manager"
	podExtra         = "authentication.kubernetes.io/pod-name"
)

// shareManagerClient acts as the share manager's service account with a
// token bound to pod (none: a token that names no pod).
func shareManagerClient(t *testing.T, pod string) (client.Client, kubernetes.Interface) {
	t.Helper()
	var extra []map[string][]string
	if pod != "" {
		extra = append(extra, map[string][]string{podExtra: {pod}})
	}
	cfg := impersonate(shareManagerUser, extra...)
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, cs
}

func isSharePolicyDenial(err error) bool {
	return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy 'berth-share-manager-own-lease'") &&
		!strings.Contains(err.Error(), "resulted in error")
}

// TestShareManagerWritesOnlyItsOwnLease installs the chart and acts as
// the share manager of volume vol-a: the real share.Lease takes, renews
// and releases Lease vol-a; writing another share's Lease, the
// operator's leader-election Lease, or its own as another holder is
// refused by the API server, as is every write by a token naming no pod.
// The chart's NetworkPolicy, when CIDRs are given, admits NFS and the
// probes' port only from them.
func TestShareManagerWritesOnlyItsOwnLease(t *testing.T) {
	suite.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out := template(t, "--include-crds", "--set", "namespace.create=true", "--set", "shareManager.networkPolicy.nfsClientCIDRs={10.9.0.0/16}")
	_, kinds := apply(ctx, t, out)
	if kinds["NetworkPolicy"] != 1 {
		t.Errorf("chart rendered %v, want the share managers' NetworkPolicy", kinds)
	}
	np := &networkingv1.NetworkPolicy{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: releaseNamespace, Name: "berth-share-manager"}, np); err != nil {
		t.Fatal(err)
	}
	if r := np.Spec.Ingress; len(r) != 1 || len(r[0].From) != 1 || r[0].From[0].IPBlock == nil || r[0].From[0].IPBlock.CIDR != "10.9.0.0/16" ||
		len(r[0].Ports) != 2 || r[0].Ports[0].Port.IntValue() != 2049 || r[0].Ports[1].Port.IntValue() != sharemanager.HealthPort ||
		np.Spec.PodSelector.MatchLabels["app.kubernetes.io/component"] != "share-manager" {
		t.Errorf("NetworkPolicy %+v", np.Spec)
	}

	admin := env.Client
	lease := func(name, holder string) *coordinationv1.Lease {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: releaseNamespace},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](10)}}
		t.Cleanup(func() { _ = admin.Delete(context.Background(), l.DeepCopy()) })
		return l
	}
	podA := sharemanager.Name("vol-a")
	smA, csA := shareManagerClient(t, podA)
	_, noPod := shareManagerClient(t, "")

	// Someone else's Leases: another share's and the operator's.
	for _, l := range []*coordinationv1.Lease{lease("vol-b", "share-manager-vol-b_u2"), lease("berth-operator-leader", "op")} {
		if err := admin.Create(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	// The policy is picked up a moment after it is created.
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l := get(ctx, t, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "vol-b", Namespace: releaseNamespace}})
		l.Spec.HolderIdentity = ptr.To(podA + "_u1")
		return isSharePolicyDenial(smA.Update(ctx, l)), nil
	})
	if err != nil {
		t.Fatalf("share manager of vol-a taking vol-b's Lease: not refused by the admission policy: %v", err)
	}
	refused := func(what string, err error) {
		t.Helper()
		if !isSharePolicyDenial(err) {
			t.Errorf("%s: %v, want refused by the admission policy", what, err)
		} else {
			t.Logf("%s: refused: %v", what, err)
		}
	}
	op := get(ctx, t, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "berth-operator-leader", Namespace: releaseNamespace}})
	op.Spec.HolderIdentity = ptr.To(podA + "_u1")
	refused("take the operator's Lease", smA.Update(ctx, op))
	if err := smA.Delete(ctx, lease("vol-b", "")); !apierrors.IsForbidden(err) {
		t.Errorf("delete another share's Lease: %v, want Forbidden by RBAC", err)
	}
	refused("create its own Lease as another holder", smA.Create(ctx, lease("vol-a", "share-manager-vol-b_u2")))
	_, err = noPod.CoordinationV1().Leases(releaseNamespace).Create(ctx, lease("vol-a", podA+"_u1"), metav1.CreateOptions{})
	refused("token naming no pod", err)

	// Its own Lease, through the real holder: taken, renewed, released.
	l, err := share.NewLease(share.LeaseConfig{Namespace: releaseNamespace, Name: "vol-a", Holder: podA + "_u1", Duration: 3 * time.Second},
		csA.CoordinationV1(), clock.RealClock{}, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Delete(context.Background(), lease("vol-a", "")) })
	if err := l.Acquire(ctx); err != nil {
		t.Fatalf("share manager taking its own Lease: %v", err)
	}
	rctx, stop := context.WithTimeout(ctx, 2500*time.Millisecond)
	if err := l.Renew(rctx); err != nil {
		t.Errorf("share manager renewing its own Lease: %v", err)
	}
	stop()
	if err := l.Release(ctx); err != nil {
		t.Errorf("share manager releasing its own Lease: %v", err)
	}

	// A volume name too long for a pod name: its pod's cut name still
	// finds its own Lease, and not another long one's.
	long := "pvc-" + strings.Repeat("a", 56)
	other := "pvc-" + strings.Repeat("b", 56)
	smLong, _ := shareManagerClient(t, sharemanager.Name(long))
	if err := smLong.Create(ctx, lease(long, sharemanager.Name(long)+"_u3")); err != nil {
		t.Errorf("share manager of a long volume name creating its Lease: %v", err)
	}
	refused("long-named share taking another long one's Lease", smLong.Create(ctx, lease(other, sharemanager.Name(long)+"_u3")))
}
