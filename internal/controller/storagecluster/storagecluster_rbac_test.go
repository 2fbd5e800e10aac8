package storagecluster_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/controller/storagecluster"
)

// operatorClient installs the operator's generated roles
// (config/rbac/operator), binds them to a user of their own and returns a
// client acting as that user: the API server's RBAC then allows exactly
// what the markers grant.
func operatorClient(t *testing.T) client.Client {
	t.Helper()
	const user = "berth-operator-rbac-test"
	data, err := os.ReadFile("../../../config/rbac/operator/role.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		if strings.TrimSpace(strings.Trim(doc, "-")) == "" {
			continue
		}
		role := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &role.Object); err != nil {
			t.Fatal(err)
		}
		role.SetName(user)
		if err := env.Client.Create(testCtx(t), role); err != nil {
			t.Fatalf("%s: %v", role.GetKind(), err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), role) })
		subjects := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}
		var binding client.Object = &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user}, Subjects: subjects,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user}}
		if role.GetKind() == "Role" {
			binding = &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: role.GetNamespace()}, Subjects: subjects,
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user}}
		}
		if err := env.Client.Create(testCtx(t), binding); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), binding) })
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
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
	r := &storagecluster.Reconciler{Client: c, Options: opts, Log: logr.Discard()}
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
