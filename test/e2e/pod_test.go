//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// testPodWritesAndReadsEmptyDir proves the node runs real pods: an init
// container writes a file to an emptyDir, the main container reads it back.
func testPodWritesAndReadsEmptyDir(t *testing.T) {
	env, cs, ctx, ns := clusterNamespace(t, 3*time.Minute)

	token := fmt.Sprintf("berth-e2e-%d", time.Now().UnixNano())
	busybox := func(name, script string) corev1.Container {
		return corev1.Container{
			Name: name, Image: env.BusyboxImage, ImagePullPolicy: corev1.PullNever,
			Command:      []string{"sh", "-c", script},
			VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
		}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "emptydir"},
		Spec: corev1.PodSpec{
			RestartPolicy:  corev1.RestartPolicyNever,
			InitContainers: []corev1.Container{busybox("writer", "echo "+token+" > /data/f && sync")},
			Containers:     []corev1.Container{busybox("reader", "cat /data/f")},
			Volumes:        []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		},
	}
	start := time.Now()
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	phase := waitPodDone(ctx, t, cs, ns, pod.Name)
	t.Logf("pod %s after %v", phase, time.Since(start).Round(time.Millisecond))
	if phase != corev1.PodSucceeded {
		t.Fatalf("pod phase %s, want Succeeded", phase)
	}
	logs, err := cs.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "reader"}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("reader logs: %v", err)
	}
	if got := strings.TrimSpace(string(logs)); got != token {
		t.Fatalf("reader read %q, want %q", got, token)
	}
}

// waitPodDone waits for the pod to finish and returns its phase.
func waitPodDone(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name string) corev1.PodPhase {
	t.Helper()
	var phase corev1.PodPhase
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, tolerant(t, func(ctx context.Context) (bool, error) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		phase = p.Status.Phase
		return phase == corev1.PodSucceeded || phase == corev1.PodFailed, nil
	}))
	if err != nil {
		t.Fatalf("wait for pod %s/%s (phase %q): %v", ns, name, phase, err)
	}
	return phase
}

// clusterNamespace skips without a cluster; it returns the cluster, a
// context that ends with the test or after d, and a namespace of the test.
func clusterNamespace(t *testing.T, d time.Duration) (Env, kubernetes.Interface, context.Context, string) {
	t.Helper()
	env, cs := needCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return env, cs, ctx, testNamespace(ctx, t, cs)
}

// testNamespace makes a namespace that is deleted, and waited for, when t ends.
func testNamespace(ctx context.Context, t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	// The namespace controller needs the default service account to exist
	// before pods may be created in it.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cs.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("default service account in %s: %v", ns.Name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := cs.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete namespace %s: %v", ns.Name, err)
			return
		}
		err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			_, err := cs.CoreV1().Namespaces().Get(ctx, ns.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		if err != nil {
			t.Errorf("namespace %s not gone: %v", ns.Name, err)
		}
	})
	return ns.Name
}
