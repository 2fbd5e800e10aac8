//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// testPodsReachAPIServer: on every node, pods on the pod network and
// hostNetwork pods (the berth driver's kind) reach the API server at the
// in-cluster address Kubernetes injects (kube-proxy, or the hub's lo), and
// a pod on the first node through its pod IP (routes between the nodes). A
// listener on the host's end of the hub's veth is reached from neither:
// nothing of the nodes is forwarded to the host.
func testPodsReachAPIServer(t *testing.T) {
	env, cs, ctx, ns := clusterNamespace(t, 4*time.Minute)

	hostIP := env.need(t, "HOST_IP", "the host's end of the hub's veth")
	ln, err := net.Listen("tcp", net.JoinHostPort(hostIP, "0"))
	if err != nil {
		t.Fatalf("listen on the host's veth address: %v", err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	hostAddr := ln.Addr().(*net.TCPAddr)
	nodes := env.Nodes()

	// A web server on the pod network of the first node.
	pong := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pong"},
		Spec: corev1.PodSpec{
			// httpd as PID 1 ignores SIGTERM: without this the namespace's
			// deletion waits out the default 30 s.
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			NodeSelector:                  map[string]string{hostnameLabel: nodes[0]},
			Containers: []corev1.Container{{
				Name: "c", Image: env.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", "mkdir /www && echo pong > /www/index.html && exec httpd -f -p 8080 -h /www"},
			}},
		},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pong, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pong: %v", err)
	}
	var pongIP string
	err = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, "pong", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pongIP = p.Status.PodIP
		return p.Status.Phase == corev1.PodRunning && pongIP != "", nil
	})
	if err != nil {
		t.Fatalf("pong Running: %v", err)
	}

	const script = `echo | nc -w 3 "$KUBERNETES_SERVICE_HOST" "$KUBERNETES_SERVICE_PORT" && echo api-ok; ` +
		`echo | nc -w 3 "$HOST_IP" "$HOST_PORT" 2>/dev/null && echo host-open || echo host-closed; ` +
		`printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 "$PONG_IP" 8080 | grep -x pong || echo no-pong`
	want := map[string]string{}
	for i, node := range nodes {
		for _, hostNet := range []bool{false, true} {
			name := fmt.Sprintf("%s-%d", map[bool]string{false: "podnet", true: "hostnet"}[hostNet], i+1)
			want[name] = "api-ok\nhost-closed\npong"
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: corev1.PodSpec{
					HostNetwork:   hostNet,
					RestartPolicy: corev1.RestartPolicyNever,
					NodeSelector:  map[string]string{hostnameLabel: node},
					Containers: []corev1.Container{{
						Name: "c", Image: env.BusyboxImage, ImagePullPolicy: corev1.PullNever,
						Command: []string{"sh", "-c", script},
						Env: []corev1.EnvVar{
							{Name: "HOST_IP", Value: hostIP},
							{Name: "HOST_PORT", Value: strconv.Itoa(hostAddr.Port)},
							{Name: "PONG_IP", Value: pongIP},
						},
					}},
				},
			}
			if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatalf("create %s: %v", name, err)
			}
		}
	}
	for name, w := range want {
		if phase := waitPodDone(ctx, t, cs, ns, name); phase != corev1.PodSucceeded {
			t.Fatalf("%s: phase %s", name, phase)
		}
		if got := podLogs(ctx, t, cs, ns, name, "c"); got != w {
			t.Errorf("%s printed %q, want %q", name, got, w)
		}
	}
}

// testBerthImageRunsItsTools: the berth image (built when up.sh had
// BERTH_E2E_BERTH_BINARY) runs berth and the dynamically linked tools it
// execs, so their libraries came along.
func testBerthImageRunsItsTools(t *testing.T) {
	env, cs := needCluster(t)
	if env.BerthImage == "" {
		t.Skip("no berth image: run up.sh with BERTH_E2E_BERTH_BINARY=bin/berth (make build)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := testNamespace(ctx, t, cs)
	// The image has no shell: one container per tool, found through the
	// image's PATH, each printing its version.
	tools := map[string][]string{
		"berth": {"berth", "version"}, "mkfs-ext4": {"mkfs.ext4", "-V"}, "mkfs-xfs": {"mkfs.xfs", "-V"},
		"xfs-growfs": {"xfs_growfs", "-V"}, "losetup": {"losetup", "--version"}, "blkid": {"blkid", "-V"},
		"mount": {"mount", "--version"}, "umount": {"umount", "--version"},
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "tools"},
		Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever},
	}
	for name, cmd := range tools {
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{
			Name: name, Image: env.BerthImage, ImagePullPolicy: corev1.PullNever, Command: cmd,
		})
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	phase := waitPodDone(ctx, t, cs, ns, pod.Name)
	for name := range tools {
		got := podLogs(ctx, t, cs, ns, pod.Name, name)
		t.Logf("%s: %s", name, strings.SplitN(got, "\n", 2)[0])
	}
	if phase != corev1.PodSucceeded {
		t.Fatalf("tools pod phase %s, want Succeeded", phase)
	}
}

func podLogs(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, pod, container string) string {
	t.Helper()
	b, err := cs.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("logs of %s/%s: %v", pod, container, err)
	}
	return strings.TrimSpace(string(b))
}
