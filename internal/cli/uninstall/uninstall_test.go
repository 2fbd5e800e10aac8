package uninstall

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/scheme"
)

// The real-API-server test of this command, with the chart's RBAC, is
// deploy/uninstall_test.go; these cover what it cannot make happen.

const ns = "berth-system"

func mine(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{
		"app.kubernetes.io/name": "berth", "app.kubernetes.io/managed-by": "berth-operator",
	}}
}

func operatorDeployment() *appsv1.Deployment {
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "berth-operator", Namespace: ns}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To[int32](1),
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/component": "operator"}},
	}}
}

func config(t *testing.T, objs ...client.Object) (Config, client.Client, *bytes.Buffer) {
	t.Helper()
	s, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
	var out bytes.Buffer
	return Config{Namespace: ns, Operator: "berth-operator", Wait: 300 * time.Millisecond, Poll: 10 * time.Millisecond, Client: c, Out: &out}, c, &out
}

func TestRefusesWhileAVolumeIsLeft(t *testing.T) {
	agent := &appsv1.DaemonSet{ObjectMeta: mine("berth-agent")}
	cfg, c, _ := config(t, operatorDeployment(), agent, &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-1"}})
	err := cfg.Run(context.Background())
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "1 Volume(s)") {
		t.Fatalf("Run with a Volume left: %v, want ErrInUse naming it", err)
	}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(agent), &appsv1.DaemonSet{}); err != nil {
		t.Errorf("refused, yet the agent DaemonSet is gone: %v", err)
	}
	dep := &appsv1.Deployment{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "berth-operator"}, dep); err != nil || *dep.Spec.Replicas != 1 {
		t.Errorf("refused, yet the operator was scaled: %v %v", err, dep.Spec.Replicas)
	}
}

// An operator pod that does not go stops the uninstall before anything
// is deleted: the operator would deploy it all again.
func TestWaitsForTheOperatorToGo(t *testing.T) {
	stuck := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "berth-operator-abc", Namespace: ns,
		Labels: map[string]string{"app.kubernetes.io/component": "operator"}}}
	agent := &appsv1.DaemonSet{ObjectMeta: mine("berth-agent")}
	cfg, c, _ := config(t, operatorDeployment(), stuck, agent)
	err := cfg.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "berth-operator-abc") {
		t.Fatalf("Run with the operator's pod staying: %v, want an error naming it", err)
	}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(agent), &appsv1.DaemonSet{}); err != nil {
		t.Errorf("the agent DaemonSet went while the operator still ran: %v", err)
	}
	// Scaled back: it deploys whatever went again.
	dep := &appsv1.Deployment{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "berth-operator"}, dep); err != nil || *dep.Spec.Replicas != 1 {
		t.Errorf("the operator after a failed uninstall: %v, replicas %v (want 1)", err, dep.Spec.Replicas)
	}
	if !strings.Contains(err.Error(), "scaled back to 1") {
		t.Errorf("the error does not say the operator was scaled back: %v", err)
	}
}

// The release's own StorageCluster (storageCluster.create) goes first, as
// Helm would delete it after the hook; another one refuses the uninstall.
func TestDeletesOnlyTheReleasesStorageCluster(t *testing.T) {
	helmAnn := map[string]string{"meta.helm.sh/release-name": "berth", "meta.helm.sh/release-namespace": ns}
	chartMade := &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "berth", Annotations: helmAnn}}
	userMade := &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "fast"}}
	cfg, c, _ := config(t, operatorDeployment(), chartMade, userMade)
	cfg.Release = "berth"
	err := cfg.Run(context.Background())
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "fast") {
		t.Fatalf("Run with a user's StorageCluster left: %v, want ErrInUse naming it", err)
	}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(chartMade), &v1.StorageCluster{}); !apierrors.IsNotFound(err) {
		t.Errorf("the release's StorageCluster: %v, want deleted", err)
	}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(userMade), &v1.StorageCluster{}); err != nil {
		t.Errorf("the user's StorageCluster: %v, want kept", err)
	}
	if err := c.Delete(context.Background(), userMade); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Run(context.Background()); err != nil {
		t.Errorf("Run once no StorageCluster is left: %v", err)
	}
}

// A pod being deleted on a node that is not Ready cannot be confirmed gone
// by its kubelet: it does not hold the uninstall up.
func TestPodsOnALostNodeDoNotHoldUp(t *testing.T) {
	lost := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "lost"},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown}}}}
	stuck := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "berth-agent-x", Namespace: ns, Finalizers: []string{"test/hold"},
		Labels: map[string]string{"app.kubernetes.io/name": "berth", "app.kubernetes.io/component": "agent"}},
		Spec: corev1.PodSpec{NodeName: "lost"}}
	cfg, c, _ := config(t, operatorDeployment(), lost, stuck)
	if err := c.Delete(context.Background(), stuck); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Run(context.Background()); err != nil {
		t.Errorf("Run with a terminating pod on a lost node: %v", err)
	}
}

// Only what the operator labels as its own goes; the CSIDriver of
// another installer of berth.io stays.
func TestRemovesOnlyTheOperatorsObjects(t *testing.T) {
	keeper := &appsv1.DaemonSet{ObjectMeta: mine("berth-keeper")}
	svc := &corev1.Service{ObjectMeta: mine("berth-agent-metrics")}
	chartSvc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "berth-operator-metrics", Namespace: ns,
		Labels: map[string]string{"app.kubernetes.io/name": "berth", "app.kubernetes.io/managed-by": "Helm"}}}
	other := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: v1.DriverName}}
	cfg, c, out := config(t, operatorDeployment(), keeper, svc, chartSvc, other)
	if err := cfg.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []client.Object{keeper, svc} {
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); !apierrors.IsNotFound(err) {
			t.Errorf("%s after uninstall: %v, want NotFound", obj.GetName(), err)
		}
	}
	for _, obj := range []client.Object{chartSvc, other} {
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
			t.Errorf("%s (not the operator's) after uninstall: %v", obj.GetName(), err)
		}
	}
	if !strings.Contains(out.String(), "DaemonSet/berth-keeper") {
		t.Errorf("output does not name what went:\n%s", out)
	}
}
