package metrics

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/berth-io/berth/internal/testenv"
)

var suite = &testenv.Suite{}

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, suite)) }

// TestSecureMetrics: with --metrics-secure each component's /metrics is
// HTTPS and answers only a reader the API server vouches for and allows
// get on /metrics (the chart's berth-metrics-reader rule): no token 401,
// another service account's 403, plain HTTP refused. Each endpoint asks
// the API server as its component's user, with exactly the rights of its
// generated role: the operator and agent through controller-runtime's
// server (ServerOptions), the CSI controller through SecureHandler and
// TLSListener.
func TestSecureMetrics(t *testing.T) {
	env := suite.Require(t)
	ctx := testenv.Context(t, 2*time.Minute)
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	reader, stranger := tokens(ctx, t, cs)

	endpoints := map[string]string{}
	for _, component := range []string{"operator", "agent"} {
		addr, err := testenv.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		mgr, err := ctrl.NewManager(env.ComponentConfig(t, component, "metrics-"+component), ctrl.Options{
			Scheme: env.Scheme, Logger: testr.New(t), Metrics: ServerOptions(addr, true), HealthProbeBindAddress: "0",
		})
		if err != nil {
			t.Fatal(err)
		}
		testenv.Serve(t, component, mgr.Start)
		endpoints[component] = addr
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_secure_test_total", Help: "a sample"}))
	h, err := SecureHandler(env.ComponentConfig(t, "csi-controller", "metrics-csi-controller"), testr.New(t), Handler(reg))
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tl, err := TLSListener(l)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Serve(t, "csi-controller metrics", func(ctx context.Context) error { return Serve(ctx, tl, h) })
	endpoints["csi-controller"] = l.Addr().String()

	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // each endpoint's certificate is self-signed
	}}
	for component, addr := range endpoints {
		url := "https://" + addr + "/metrics"
		testenv.Eventually(t, 30*time.Second, component+" serves its secure /metrics to the reader", func(ctx context.Context) (bool, error) {
			code, _, err := get(ctx, client, url, reader)
			return err == nil && code == http.StatusOK, nil
		})
		code, body, err := get(ctx, client, url, reader)
		if err != nil || code != http.StatusOK || !strings.Contains(body, "# TYPE ") {
			t.Errorf("%s: the reader got %d, %v: %.200s", component, code, err, body)
		}
		for who, token := range map[string]string{"no token": "", "another service account": stranger, "a made-up token": "x.y.z"} {
			code, body, err := get(ctx, client, url, token)
			want := http.StatusUnauthorized
			switch who {
			case "another service account":
				want = http.StatusForbidden
			case "a made-up token":
				// controller-runtime's filter answers a token the API
				// server cannot parse with 500: refused all the same.
				want = http.StatusInternalServerError
			}
			if err != nil || code != want {
				t.Errorf("%s, %s: %d, %v (%.100s); want %d", component, who, code, err, body, want)
			}
		}
		if code, _, err := get(ctx, http.DefaultClient, "http://"+addr+"/metrics", reader); err == nil && code == http.StatusOK {
			t.Errorf("%s served its metrics over plain HTTP", component)
		}
	}
}

// tokens makes two service accounts and returns a token of each: the
// reader's, bound to the chart's metrics reader rule, and a stranger's.
func tokens(ctx context.Context, t *testing.T, cs kubernetes.Interface) (reader, stranger string) {
	t.Helper()
	const ns = "metrics-readers"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "berth-metrics-reader-test"},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.RbacV1().ClusterRoles().Delete(context.Background(), role.Name, metav1.DeleteOptions{}) })
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "prometheus"}},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name}}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})
	token := func(name string) string {
		t.Helper()
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("token of %s: %v", name, err)
		}
		return tr.Status.Token
	}
	return token("prometheus"), token("stranger")
}

// get GETs url with token as its bearer ("" none) and returns the status
// and body.
func get(ctx context.Context, c *http.Client, url, token string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}
