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
