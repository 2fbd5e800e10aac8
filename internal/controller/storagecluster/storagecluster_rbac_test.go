package storagecluster_test

import (
	"context"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/controller/storagecluster"
)

// operatorClient acts with exactly the operator's generated roles.
func operatorClient(t *testing.T) client.Client {
	t.Helper()
	return env.ComponentClient(t, "operator", "berth-operator-rbac-test")
}

// TestOperatorRoleCoversMultus: with only its generated roles, the
// operator reconciles a mover-mode cluster (holder and mover DaemonSets,
// the NetworkAttachmentDefinition read) and removes both again; it may
// get a definition but not list them.
func TestOperatorRoleCoversMultus(t *testing.T) {
	suite.Require(t)
	installNADCRD(t)
	putNAD(t, "rbac-net", "public", macvlan("whereabouts"))
	c := operatorClient(t)
	sc := newCluster(t, "rbac", v1.StorageClusterSpec{DataDir: "/srv/rbac", Network: v1.NetworkSpec{
		Provider: v1.NetworkProviderMultus, Selectors: &v1.NetworkSelectors{Public: "rbac-net/public"},
		Multus: &v1.MultusSpec{Mode: v1.MultusModeMover}}})
	r := reconcilerOn(c)
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(sc)}
	eventually(t, "a reconcile as the operator's role succeeds", func(ctx context.Context) (bool, error) {
		_, err := r.Reconcile(ctx, req)
		return err == nil, err
	})
	get(t, daemonSet(storagecluster.HolderName(sc.Name)))
	get(t, daemonSet("berth-mover"))

	nad := &unstructured.Unstructured{}
	nad.SetAPIVersion("k8s.cni.cncf.io/v1")
	nad.SetKind("NetworkAttachmentDefinition")
	if err := c.Get(testCtx(t), client.ObjectKey{Namespace: "rbac-net", Name: "public"}, nad); err != nil {
		t.Errorf("get a NetworkAttachmentDefinition as the operator: %v", err)
	}
	list := &unstructured.UnstructuredList{}
	list.SetAPIVersion("k8s.cni.cncf.io/v1")
	list.SetKind("NetworkAttachmentDefinitionList")
	if err := c.List(testCtx(t), list, client.InNamespace("rbac-net")); !apierrors.IsForbidden(err) {
		t.Errorf("list NetworkAttachmentDefinitions as the operator: %v, want forbidden", err)
	}

	updateCluster(t, sc, func(s *v1.StorageClusterSpec) { s.Network = v1.NetworkSpec{Provider: v1.NetworkProviderHost} })
	eventually(t, "a reconcile as the operator's role removes holder and mover", func(ctx context.Context) (bool, error) {
		if _, err := r.Reconcile(ctx, req); err != nil {
			return false, err
		}
		holder := apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: storagecluster.HolderName(sc.Name)}, daemonSet("x")))
		mover := apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "berth-mover"}, daemonSet("x")))
		return holder && mover, nil
	})
}
