//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// testClusterDNS: the cluster has what every real cluster has, a cluster
// DNS and kube-proxy. A pod gets no MissingClusterDNS warning, resolves the
// kubernetes Service by name and reaches the API server through it, reaches
// another pod through a Service by its short name, and a name outside the
// cluster domain is refused (nothing is forwarded off the machine).
func testClusterDNS(t *testing.T) {
	env, cs, ctx, ns := clusterNamespace(t, 3*time.Minute)

	dnsIP := env.need(t, "DNS_SERVICE_IP", "the cluster has no DNS (hack/cluster/dns.sh)")
	kubeSvc, err := cs.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("kubernetes Service: %v", err)
	}
	token := fmt.Sprintf("berth-dns-%d", time.Now().UnixNano())
	web := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"app": "web"}},
		// httpd as PID 1 ignores SIGTERM: without this the namespace's
		// deletion waits out the default 30 s.
		Spec: corev1.PodSpec{TerminationGracePeriodSeconds: ptr.To[int64](1), Containers: []corev1.Container{{
			Name: "httpd", Image: env.BusyboxImage, ImagePullPolicy: corev1.PullNever,
			Command: []string{"sh", "-c", "mkdir /www && echo " + token + " > /www/index.html && exec httpd -f -p 8080 -h /www"},
			Ports:   []corev1.ContainerPort{{ContainerPort: 8080}},
			ReadinessProbe: &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}},
				PeriodSeconds: 1,
			},
		}}},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, web, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create web pod: %v", err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	if _, err := cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create web Service: %v", err)
	}

	// busybox's nslookup resolves (its own DNS client) and nc talks HTTP:
	// the static busybox's wget and libc resolver crash without NSS
	// libraries. The API server is reached through its Service when its
	// Go TLS server answers the plain HTTP request. Retries: the web pod
	// and kube-proxy's rules for its Service may still be on their way.
	const script = `grep '^nameserver' /etc/resolv.conf
resolve() { nslookup "$1" | sed -n 's/^Address: \([0-9.]*\)$/\1/p' | head -n1; }
get() { printf 'GET / HTTP/1.0\r\nHost: x\r\n\r\n' | nc -w 3 "$1" "$2"; }
api=$(resolve kubernetes.default.svc.cluster.local)
echo "kubernetes-ip $api"
for i in $(seq 30); do
  get "$api" 443 | grep -q 'HTTPS server' && { echo api-ok; break; }
  sleep 1
done
for i in $(seq 30); do
  web=$(resolve "web.$NS.svc.cluster.local")
  [ -n "$web" ] && out=$(get "$web" 80 | tail -n1) && [ -n "$out" ] && { echo "web $out"; break; }
  sleep 1
done
nslookup example.com >/dev/null 2>&1 && echo outside-resolved || echo outside-refused`
	client := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "client"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "c", Image: env.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", script},
				Env:     []corev1.EnvVar{{Name: "NS", Value: ns}},
			}},
		},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, client, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create client pod: %v", err)
	}
	phase := waitPodDone(ctx, t, cs, ns, client.Name)
	got := podLogs(ctx, t, cs, ns, client.Name, "c")
	t.Logf("client printed:\n%s", got)
	if phase != corev1.PodSucceeded {
		t.Fatalf("client phase %s", phase)
	}
	for _, want := range []string{
		"nameserver " + dnsIP,
		"kubernetes-ip " + kubeSvc.Spec.ClusterIP,
		"api-ok",
		"web " + token,
		"outside-refused",
	} {
		if !containsLine(got, want) {
			t.Errorf("client did not print %q", want)
		}
	}

	evs, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
		"involvedObject.name": client.Name, "reason": "MissingClusterDNS",
	}.String()})
	if err != nil {
		t.Fatalf("list events: %v", err)
	}
	for _, e := range evs.Items {
		t.Errorf("event %s: %s", e.Reason, e.Message)
	}
}

func containsLine(text, line string) bool {
	for _, l := range strings.Split(text, "\n") {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}
