package deploy_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/cli/uninstall"
)

// TestChartRendersUninstallHook: `helm uninstall` first runs `berth
// uninstall` as its own service account (a pre-delete hook), which
// removes what the operator deployed; the plain manifests leave the hook
// out (kubectl apply would run it at once).
func TestChartRendersUninstallHook(t *testing.T) {
	var job *batchv1.Job
	for _, o := range render(t, "image.tag=test") {
		if o.GetKind() == "Job" && o.GetName() == "berth-uninstall" {
			job = &batchv1.Job{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, job); err != nil {
				t.Fatal(err)
			}
		}
	}
	if job == nil {
		t.Fatal("the chart renders no Job berth-uninstall")
	}
	pod := job.Spec.Template.Spec
	if job.Annotations["helm.sh/hook"] != "pre-delete" || pod.ServiceAccountName != "berth-uninstall" ||
		len(pod.Containers) != 1 || len(pod.Containers[0].Args) == 0 || pod.Containers[0].Args[0] != "uninstall" {
		t.Errorf("uninstall Job: hook %q, service account %q, containers %+v", job.Annotations["helm.sh/hook"], pod.ServiceAccountName, pod.Containers)
	}
	if c := pod.Containers[0]; c.Image != "berth.local/berth:test" {
		t.Errorf("uninstall Job image %q, want berth's", c.Image)
	}
	for _, o := range decode(t, template(t, "--no-hooks")) {
		if o.GetKind() == "Job" {
			t.Errorf("--no-hooks still renders the Job %s", o.GetName())
		}
	}
}

// uninstallAs is `berth uninstall` as the chart's hook runs it, with the
// API identity of its service account.
func uninstallAs() *uninstall.Config {
	as, err := client.New(impersonate("system:serviceaccount:"+releaseNamespace+":berth-uninstall"), client.Options{Scheme: env.Scheme})
	if err != nil {
		panic(err)
	}
	return &uninstall.Config{Namespace: releaseNamespace, Operator: "berth-operator", Release: "berth", Wait: 10 * time.Second,
		Poll: 100 * time.Millisecond, Client: as, Out: &bytes.Buffer{}}
}

// refusedUninstall: with a StorageCluster left, uninstall refuses and
// changes nothing.
func refusedUninstall(ctx context.Context, t *testing.T, un *uninstall.Config) {
	t.Helper()
	err := un.Run(ctx)
	if !errors.Is(err, uninstall.ErrInUse) {
		t.Fatalf("uninstall with a StorageCluster left: %v, want ErrInUse", err)
	}
	t.Logf("refused: %v", err)
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: releaseNamespace, Name: "berth-agent"}, &appsv1.DaemonSet{}); err != nil {
		t.Errorf("a refused uninstall removed the agent DaemonSet: %v", err)
	}
	dep := &appsv1.Deployment{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: releaseNamespace, Name: "berth-operator"}, dep); err != nil || dep.Spec.Replicas == nil || *dep.Spec.Replicas == 0 {
		t.Errorf("a refused uninstall scaled the operator: %v %v", err, dep.Spec.Replicas)
	}
}

// uninstalled: with no StorageCluster and no Volume, uninstall (with the
// chart's RBAC for its service account) scales the operator to 0 and removes the node-wide set and
// the CSIDriver; the chart's own objects stay for Helm; a second run finds
// nothing to do.
func uninstalled(ctx context.Context, t *testing.T, un *uninstall.Config) {
	t.Helper()
	out := un.Out.(*bytes.Buffer)
	if err := un.Run(ctx); err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out)
	}
	t.Logf("uninstall said:\n%s", out)
	dep := &appsv1.Deployment{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: releaseNamespace, Name: "berth-operator"}, dep); err != nil || dep.Spec.Replicas == nil || *dep.Spec.Replicas != 0 {
		t.Errorf("operator Deployment after uninstall: %v, replicas %v (want 0)", err, dep.Spec.Replicas)
	}
	for name, obj := range map[string]client.Object{
		"berth-agent":                  &appsv1.DaemonSet{},
		"berth-keeper":                 &appsv1.DaemonSet{},
		"berth-csi-controller":         &appsv1.Deployment{},
		"berth-agent-metrics":          &corev1.Service{},
		"berth-csi-controller-metrics": &corev1.Service{},
	} {
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: releaseNamespace, Name: name}, obj); !apierrors.IsNotFound(err) {
			t.Errorf("%T %s after uninstall: %v, want NotFound", obj, name, err)
		}
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: v1.DriverName}, &storagev1.CSIDriver{}); !apierrors.IsNotFound(err) {
		t.Errorf("CSIDriver %s after uninstall: %v, want NotFound", v1.DriverName, err)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: releaseNamespace, Name: "berth-operator-metrics"}, &corev1.Service{}); err != nil {
		t.Errorf("the chart's operator Service (Helm's to remove): %v", err)
	}
	out.Reset()
	if err := un.Run(ctx); err != nil {
		t.Errorf("uninstall run again: %v\n%s", err, out)
	}
}
