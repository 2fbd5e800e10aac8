// Package deploy_test checks the Helm chart in deploy/berth: it lints, it
// renders, and what it renders installs into a real API server, where the
// operator, running with exactly the chart's RBAC, brings up a StorageCluster.
package deploy_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/cli/dev"
	"github.com/berth-io/berth/internal/cli/operator"
	"github.com/berth-io/berth/internal/controller/storagecluster"
	"github.com/berth-io/berth/internal/testenv"
)

const (
	releaseNamespace = "berth-system"
	chartDir         = "deploy/berth"
)

var (
	env   *testenv.Env
	suite = &testenv.Suite{Setup: func(e *testenv.Env) error { env = e; return nil }}
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, suite)) }

// helmBinary returns the pinned helm that `make helm` builds into bin/.
func helmBinary(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	found, _ := filepath.Glob(filepath.Join(testenv.RepoRoot(), "bin", "helm-v3.*"))
	if len(found) == 0 {
		t.Skip("helm not built: run `make helm` (make test does) or set HELM")
	}
	slices.Sort(found)
	return found[len(found)-1]
}

// kubeVersion is the Kubernetes `helm template` renders for: the pinned
// helm, built from the module proxy without release flags, would take
// v1.20, which the chart's kubeVersion refuses.
const kubeVersion = "1.34.0"

// runHelm runs helm; err is its failure, with what it printed.
func runHelm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(helmBinary(t), args...)
	cmd.Dir = testenv.RepoRoot()
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("helm %v: %w\n%s%s", args, err, stdout.String(), stderr.String())
	}
	return stdout.Bytes(), nil
}

func helm(t *testing.T, args ...string) []byte {
	t.Helper()
	out, err := runHelm(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// template renders the chart as release berth in the release namespace
// with the given flags.
func template(t *testing.T, flags ...string) []byte {
	t.Helper()
	return helm(t, append([]string{"template", "berth", chartDir, "--namespace", releaseNamespace, "--kube-version", kubeVersion}, flags...)...)
}

func TestChartLint(t *testing.T) {
	helm(t, "lint", "--strict", chartDir)
}

// TestChartInstallsAndOperatorWorks applies the rendered chart to the API
// server, then runs the operator as the chart's service account (impersonated,
// so RBAC is enforced) and wants the StorageCluster the chart made to get
// its workloads and status.
func TestChartInstallsAndOperatorWorks(t *testing.T) {
	suite.Require(t)
	out := template(t, "--include-crds", "--set", "namespace.create=true", "--set", "storageCluster.create=true",
		"--set", "image.tag=test", "--set", "image.pullPolicy=Never")
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	objs, kinds := apply(ctx, t, out)
	t.Logf("applied %d objects: %v", len(objs), kinds)
	for kind, min := range map[string]int{"CustomResourceDefinition": 6, "Deployment": 1, "ServiceAccount": 3,
		"ClusterRole": 4, "ClusterRoleBinding": 4, "Role": 2, "RoleBinding": 2, "StorageCluster": 1} {
		if kinds[kind] < min {
			t.Errorf("chart rendered %d %s, want at least %d", kinds[kind], kind, min)
		}
	}
	dep := &appsv1.Deployment{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: releaseNamespace, Name: "berth-operator"}, dep); err != nil {
		t.Fatal(err)
	}
	c := dep.Spec.Template.Spec.Containers[0]
	if dep.Spec.Template.Spec.ServiceAccountName != "berth-operator" || c.Image != "berth.local/berth:test" || c.Args[0] != "operator" {
		t.Errorf("operator Deployment: sa %q image %q args %v", dep.Spec.Template.Spec.ServiceAccountName, c.Image, c.Args)
	}
	for _, p := range []struct {
		probe *corev1.Probe
		path  string
	}{{c.LivenessProbe, "/healthz"}, {c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.StrVal != "health" {
			t.Errorf("operator probe for %s: %+v", p.path, p.probe)
		}
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[r]; !ok {
			t.Errorf("operator container has no %s request: %+v", r, c.Resources)
		}
		if _, ok := c.Resources.Limits[r]; !ok {
			t.Errorf("operator container has no %s limit: %+v", r, c.Resources)
		}
	}
	role := &rbacv1.Role{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: releaseNamespace, Name: "berth-operator"}, role); err != nil {
		t.Fatalf("operator Role in the release namespace: %v", err)
	}

	opUser := "system:serviceaccount:" + releaseNamespace + ":berth-operator"
	// RBAC is enforced: the operator's identity may not read Secrets, nor
	// touch DaemonSets outside its namespace.
	as, err := client.New(impersonate(opUser), client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := as.List(ctx, &corev1.SecretList{}); !apierrors.IsForbidden(err) {
		t.Errorf("operator listing Secrets: %v, want Forbidden", err)
	}
	if err := as.List(ctx, &appsv1.DaemonSetList{}, client.InNamespace("default")); !apierrors.IsForbidden(err) {
		t.Errorf("operator listing DaemonSets in default: %v, want Forbidden", err)
	}
	stopOperator := runOperatorAs(t, opUser)
	sc := &v1.StorageCluster{}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKey{Name: "berth"}, sc); err != nil {
			return false, err
		}
		return sc.Status.Phase == v1.StorageClusterProgressing && slices.Contains(sc.Finalizers, storagecluster.Finalizer), nil
	})
	if err != nil {
		t.Fatalf("StorageCluster from the chart not reconciled by the operator with its RBAC: %v (status %+v)", err, sc.Status)
	}
	for _, name := range []string{"berth-agent", "berth-keeper"} {
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: releaseNamespace, Name: name}, &appsv1.DaemonSet{}); err != nil {
			t.Errorf("DaemonSet %s: %v", name, err)
		}
	}
	// The operator's Role lets it make the scrape Services (the chart
	// makes the operator's own). The chart's ServiceMonitor selects each.
	scraped := serviceMonitorSelector(t)
	for _, name := range []string{"berth-agent-metrics", "berth-csi-controller-metrics", "berth-operator-metrics"} {
		svc := &corev1.Service{}
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
			return env.Client.Get(ctx, client.ObjectKey{Namespace: releaseNamespace, Name: name}, svc) == nil, nil
		})
		if err != nil || svc.Spec.ClusterIP != corev1.ClusterIPNone || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "metrics" {
			t.Errorf("scrape Service %s: %v %+v", name, err, svc.Spec)
		}
		if !scraped.Matches(labels.Set(svc.Labels)) {
			t.Errorf("the ServiceMonitor's selector %v misses the scrape Service %s %v", scraped, name, svc.Labels)
		}
	}
	// The chart's uninstall hook refuses while the cluster exists.
	un := uninstallAs()
	refusedUninstall(ctx, t, un)
	// Let the cluster go (Retain) so that nothing waits on the finalizer.
	patch := client.MergeFrom(sc.DeepCopy())
	sc.Spec.CleanupPolicy = v1.CleanupRetain
	if err := env.Client.Patch(ctx, sc, patch); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, sc); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		return isGone(ctx, sc), nil
	})
	if err != nil {
		t.Fatalf("StorageCluster not released by the operator: %v", err)
	}
	// Scaled to 0, the operator's pod would go: here its process stops.
	stopOperator()
	uninstalled(ctx, t, un)
}

func isGone(ctx context.Context, sc *v1.StorageCluster) bool {
	return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(sc), &v1.StorageCluster{}))
}

// runOperatorAs runs `berth operator` in this process with the API
// identity of user, leader election on (its Lease is part of the RBAC),
// until the test ends or stop is called. (Once per process: its
// controllers' names must be unique.)
func runOperatorAs(t *testing.T, user string) (stop func()) {
	t.Helper()
	var oc operator.Config
	fs := flag.NewFlagSet("operator", flag.ContinueOnError)
	operator.Flags(fs, &oc, func(string) string { return releaseNamespace })
	if err := fs.Parse([]string{"--health-addr=0", "--metrics-addr=0", "--image=berth.local/berth:test"}); err != nil {
		t.Fatal(err)
	}
	oc.Rest, oc.Log = impersonate(user), logr.Discard()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- oc.Run(ctx) }()
	stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("operator: %v", err)
		}
	})
	t.Cleanup(stop)
	return stop
}

// impersonate returns a config that acts as service account user, with
// the user extras of a pod-bound token when given.
func impersonate(user string, extra ...map[string][]string) *rest.Config {
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{
		"system:serviceaccounts", "system:serviceaccounts:" + releaseNamespace, "system:authenticated",
	}}
	if len(extra) > 0 {
		cfg.Impersonate.Extra = extra[0]
	}
	return cfg
}

func waitCRDs(ctx context.Context, t *testing.T) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		// Unstructured: berth's scheme does not carry apiextensions types.
		crd := &unstructured.Unstructured{}
		crd.SetAPIVersion("apiextensions.k8s.io/v1")
		crd.SetKind("CustomResourceDefinition")
		if err := env.Client.Get(ctx, client.ObjectKey{Name: "storageclusters.berth.io"}, crd); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("StorageCluster CRD not established: %v", err)
	}
}

// apply applies the rendered chart as helm install would: CRDs and the
// namespace first, the StorageCluster once its CRD serves, no hooks. It
// returns what it rendered, and how many of each kind it applied.
func apply(ctx context.Context, t *testing.T, rendered []byte) ([]*unstructured.Unstructured, map[string]int) {
	t.Helper()
	objs := decode(t, rendered)
	rank := func(o *unstructured.Unstructured) int {
		switch o.GetKind() {
		case "CustomResourceDefinition", "Namespace":
			return 0
		case "StorageCluster":
			return 2
		}
		return 1
	}
	slices.SortStableFunc(objs, func(a, b *unstructured.Unstructured) int { return rank(a) - rank(b) })
	kinds := map[string]int{}
	for _, o := range objs {
		// helm install makes a hook only when its event comes (the
		// uninstall Job: at helm uninstall).
		if o.GetAnnotations()["helm.sh/hook"] != "" {
			continue
		}
		if o.GetKind() == "StorageCluster" {
			waitCRDs(ctx, t)
		}
		if err := env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.FieldOwner("chart-test"), client.ForceOwnership); err != nil {
			t.Fatalf("apply %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		kinds[o.GetKind()]++
	}
	return objs, kinds
}

// decode splits helm's multi-document output into objects.
func decode(t *testing.T, manifest []byte) []*unstructured.Unstructured {
	t.Helper()
	d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	var objs []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		err := d.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("decode rendered chart: %v", err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

// render renders the chart with the given --set flags and returns its objects.
func render(t *testing.T, sets ...string) []*unstructured.Unstructured {
	t.Helper()
	var flags []string
	for _, s := range sets {
		flags = append(flags, "--set", s)
	}
	return decode(t, template(t, flags...))
}

// operatorPod is the operator Deployment's pod spec among objs.
func operatorPod(t *testing.T, objs []*unstructured.Unstructured) corev1.PodSpec {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() != "Deployment" || o.GetName() != "berth-operator" {
			continue
		}
		var dep appsv1.Deployment
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &dep); err != nil {
			t.Fatal(err)
		}
		return dep.Spec.Template.Spec
	}
	t.Fatal("no operator Deployment rendered")
	return corev1.PodSpec{}
}

// TestChartRegistryReachesEveryImage: image.registry names the registry of
// berth's image and of every CSI sidecar, which the operator gets as flags
// (it renders the CSI controller); the pull secrets reach the operator pod
// and, as a flag, every pod it makes. csiSidecars.registry overrides the
// sidecars' alone.
func TestChartRegistryReachesEveryImage(t *testing.T) {
	p := operatorPod(t, render(t, "image.registry=mirror.example:5000/storage", "image.tag=v9",
		"imagePullSecrets[0].name=regcred", "imagePullSecrets[1].name=other"))
	c := p.Containers[0]
	if c.Image != "mirror.example:5000/storage/berth:v9" {
		t.Errorf("operator image %q", c.Image)
	}
	for _, want := range []string{
		"--image=mirror.example:5000/storage/berth:v9",
		"--provisioner-image=mirror.example:5000/storage/csi-provisioner:v5.3.0",
		"--resizer-image=mirror.example:5000/storage/csi-resizer:v1.14.0",
		"--snapshotter-image=mirror.example:5000/storage/csi-snapshotter:v8.3.0",
		"--image-pull-secrets=regcred,other",
	} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("operator args %v lack %s", c.Args, want)
		}
	}
	if want := []corev1.LocalObjectReference{{Name: "regcred"}, {Name: "other"}}; !slices.Equal(p.ImagePullSecrets, want) {
		t.Errorf("operator pod pull secrets %v, want %v", p.ImagePullSecrets, want)
	}

	c = operatorPod(t, render(t, "image.registry=", "image.repository=example.org/berth",
		"csiSidecars.registry=registry.k8s.io/sig-storage")).Containers[0]
	for _, want := range []string{"--image=example.org/berth:dev", "--provisioner-image=registry.k8s.io/sig-storage/csi-provisioner:v5.3.0"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("operator args %v lack %s", c.Args, want)
		}
	}
	if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--image-pull-secrets") }) {
		t.Errorf("operator args %v name pull secrets, none set", c.Args)
	}
}

// TestChartOperatorBudget: with more than one replica the operator gets a
// PodDisruptionBudget that lets drains take one at a time; a single one
// gets none (it would block every drain). Placement values reach its pod.
func TestChartOperatorBudget(t *testing.T) {
	budgets := func(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
		return slices.DeleteFunc(slices.Clone(objs), func(o *unstructured.Unstructured) bool { return o.GetKind() != "PodDisruptionBudget" })
	}
	if pdbs := budgets(render(t)); len(pdbs) != 0 {
		t.Errorf("one replica: %d PodDisruptionBudgets, want none", len(pdbs))
	}
	objs := render(t, "operator.replicas=2", "operator.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=infra",
		"operator.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists")
	p := operatorPod(t, objs)
	pdbs := budgets(objs)
	if len(pdbs) != 1 {
		t.Fatalf("two replicas: %d PodDisruptionBudgets, want 1", len(pdbs))
	}
	var pdb policyv1.PodDisruptionBudget
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(pdbs[0].Object, &pdb); err != nil {
		t.Fatal(err)
	}
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || pdb.Spec.MinAvailable != nil || pdb.Namespace != releaseNamespace {
		t.Errorf("operator budget %s/%s: %+v", pdb.Namespace, pdb.Name, pdb.Spec)
	}
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() == "Deployment" && o.GetName() == "berth-operator" {
			if pod, _, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "metadata", "labels"); !sel.Matches(labels.Set(pod)) {
				t.Errorf("budget selector %v misses the operator pods %v", sel, pod)
			}
		}
	}
	if p.PriorityClassName != "system-cluster-critical" {
		t.Errorf("operator priority class %q", p.PriorityClassName)
	}
	if a := p.Affinity; a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		t.Errorf("operator affinity %+v", a)
	}
}

// TestChartOperatorOnHostNetworkRolls: on the host's network a new
// operator pod cannot start beside the old one on its node (the same
// ports), so the Deployment replaces pods without a surge; on the pod
// network it keeps the default rollout.
func TestChartOperatorOnHostNetworkRolls(t *testing.T) {
	strategy := func(sets ...string) appsv1.DeploymentStrategy {
		for _, o := range render(t, sets...) {
			if o.GetKind() != "Deployment" || o.GetName() != "berth-operator" {
				continue
			}
			var dep appsv1.Deployment
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &dep); err != nil {
				t.Fatal(err)
			}
			return dep.Spec.Strategy
		}
		t.Fatal("no operator Deployment rendered")
		return appsv1.DeploymentStrategy{}
	}
	if s := strategy(); s.RollingUpdate != nil {
		t.Errorf("pod network: strategy %+v, want the default", s)
	}
	s := strategy("operator.hostNetwork=true")
	if s.RollingUpdate == nil || s.RollingUpdate.MaxSurge.IntValue() != 0 || s.RollingUpdate.MaxUnavailable.IntValue() != 1 {
		t.Errorf("host network: strategy %+v, want maxSurge 0, maxUnavailable 1", s)
	}
}

// TestChartSchemaRefusesBadValues: values.schema.json refuses a wrong type,
// a key the chart does not know, an out-of-range number, and more than one
// operator without leader election; Chart.yaml refuses Kubernetes before
// 1.30 (the agent's admission policy needs its token's node-name extra).
func TestChartSchemaRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--set", "operator.replicas=two"}, "/operator/replicas"},
		{[]string{"--set", "operator.replica=2"}, "'replica' not allowed"},
		{[]string{"--set", "imageRegistry=mirror.example"}, "'imageRegistry' not allowed"},
		{[]string{"--set", "csiSidecars.provisioner.image=x"}, "'image' not allowed"},
		{[]string{"--set", "image.pullPolicy=Sometimes"}, "/image/pullPolicy"},
		{[]string{"--set", "operator.metricsPort=70000"}, "/operator/metricsPort"},
		{[]string{"--set", "operator.unfenceCooldown=5 minutes"}, "/operator/unfenceCooldown"},
		{[]string{"--set", "operator.replicas=2", "--set", "operator.leaderElect=false"}, "/operator/leaderElect"},
		{[]string{"--set", "imagePullSecrets[0]=regcred"}, "/imagePullSecrets/0"},
		{[]string{"--set", "monitoring.serviceMonitor.interval=30 seconds"}, "/monitoring/serviceMonitor/interval"},
		{[]string{"--set", "monitoring.prometheusRule.enable=true"}, "'enable' not allowed"},
		{[]string{"--set", "monitoring.prometheusRule.runbookBaseURL=docs/troubleshooting.md"}, "/monitoring/prometheusRule/runbookBaseURL"},
		{[]string{"--kube-version", "1.29.9"}, "requires kubeVersion"},
	} {
		args := append([]string{"template", "berth", chartDir, "--namespace", releaseNamespace, "--kube-version", kubeVersion}, tc.flags...)
		_, err := runHelm(t, args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("helm template %v: %v, want an error naming %q", tc.flags, err, tc.want)
		}
	}
	// What berth dev sets, and a port given as a number, are accepted.
	template(t, "--set-string", "apiServer.port=6443", "--set", "apiServer.host=10.0.0.1", "--set", "operator.unfenceCooldown=1m30s",
		"--set", "shareManager.networkPolicy.nfsClientCIDRs={10.0.0.0/8,fd00::/64}", "--set", "kubeletDir=/var/lib/k0s/kubelet")
	template(t, "--set", "apiServer.port=6443", "--set", "storageCluster.create=true", "--set", "storageCluster.spec.dataDir=/srv/berth")
	// Flexvolume off: the operator gets no plugin folder.
	c := operatorPod(t, decode(t, template(t, "--set", "flexvolume.enabled=false"))).Containers[0]
	if !slices.Contains(c.Args, "--volume-plugin-dir=") {
		t.Errorf("flexvolume.enabled=false: operator args %v, want an empty --volume-plugin-dir", c.Args)
	}
}

// TestChartTakesBerthDevValues: the values `berth dev` installs the chart
// with pass the schema and name the images its cluster imported.
func TestChartTakesBerthDevValues(t *testing.T) {
	values, err := dev.HelmValues(dev.ClusterEnv{"BERTH_IMAGE": "berth.local/berth:dev-1a2b", "KUBERNETES_SERVICE_HOST": "10.250.0.2",
		"KUBERNETES_SERVICE_PORT": "443", "KUBELET_ROOT": "/var/lib/kubelet", "VOLUME_PLUGIN_DIR": "/w/volume-plugins"})
	if err != nil {
		t.Fatal(err)
	}
	values = append(values, "--set-string", "operator.unfenceCooldown="+(90*time.Second).String())
	c := operatorPod(t, decode(t, template(t, values...))).Containers[0]
	for _, want := range []string{"--image=berth.local/berth:dev-1a2b", "--provisioner-image=berth.local/csi-provisioner:v5.3.0",
		"--image-pull-policy=Never", "--volume-plugin-dir=/w/volume-plugins", "--unfence-cooldown=1m30s"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("operator args %v lack %s", c.Args, want)
		}
	}
}
