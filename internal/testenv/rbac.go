package testenv

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// ComponentClient installs a component's generated roles
// (config/rbac/<component>/role.yaml), binds them to a user of their own
// and returns a client acting as that user: the API server's RBAC then
// allows exactly what the component's markers grant. The roles go at the
// end of the test.
func (e *Env) ComponentClient(t testing.TB, component, user string) client.Client {
	t.Helper()
	c, err := client.New(e.ComponentConfig(t, component, user), client.Options{Scheme: e.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// ComponentConfig is ComponentClient for code that takes a client-go
// clientset: the roles installed the same way, and a rest config acting as
// user.
func (e *Env) ComponentConfig(t testing.TB, component, user string) *rest.Config {
	t.Helper()
	ctx := context.Background()
	data, err := os.ReadFile(filepath.Join(RepoRoot(), "config", "rbac", component, "role.yaml"))
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
		if ns := role.GetNamespace(); ns != "" {
			// The namespace the role names (the release namespace), made
			// here when the test's fixture has not.
			err := e.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatal(err)
			}
		}
		if err := e.Client.Create(ctx, role); err != nil {
			t.Fatalf("%s: %v", role.GetKind(), err)
		}
		t.Cleanup(func() { _ = e.Client.Delete(context.Background(), role) })
		subjects := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}
		var binding client.Object = &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user}, Subjects: subjects,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user}}
		if role.GetKind() == "Role" {
			binding = &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: role.GetNamespace()}, Subjects: subjects,
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user}}
		}
		if err := e.Client.Create(ctx, binding); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Client.Delete(context.Background(), binding) })
	}
	cfg := rest.CopyConfig(e.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	return cfg
}
