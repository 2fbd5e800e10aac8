package storagecluster

import (
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The endpoints of berth's processes (the defaults of their flags, passed
// explicitly so that pod and process always agree). The agent runs on the
// host network: its ports must not collide with other node daemons.
const (
	AgentMetricsPort      = 9741
	AgentHealthPort       = 9742
	ControllerMetricsPort = 9743
	ControllerHealthPort  = 9744
	// KeeperHealthPort serves the keeper's /readyz (on the pod network:
	// the new keeper pod of a rollout starts beside the old one).
	KeeperHealthPort = 9746
)

// Port names: a Prometheus scrape config or ServiceMonitor selects "metrics".
const (
	portMetrics = "metrics"
	portHealth  = "health"
)

// metricsServiceSuffix names a component's scrape Service "berth-<component>-metrics".
const metricsServiceSuffix = "-metrics"

// withEndpoints makes c serve metrics (over HTTPS to authorized readers
// only when secure) and health on the given ports and probes it there:
// liveness on /healthz (the process answers), readiness on /readyz (it
// can do its job). The probes stay plain HTTP: kubelet sends no token.
func withEndpoints(c *corev1.Container, metricsPort, healthPort int32, secure bool) {
	c.Args = append(c.Args,
		"--metrics-addr=:"+strconv.Itoa(int(metricsPort)),
		"--health-addr=:"+strconv.Itoa(int(healthPort)))
	if secure {
		c.Args = append(c.Args, "--metrics-secure")
	}
	c.Ports = append(c.Ports,
		corev1.ContainerPort{Name: portMetrics, ContainerPort: metricsPort, Protocol: corev1.ProtocolTCP},
		corev1.ContainerPort{Name: portHealth, ContainerPort: healthPort, Protocol: corev1.ProtocolTCP})
	probe := func(path string, period, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: path, Port: intstr.FromString(portHealth), Scheme: corev1.URISchemeHTTP,
			}},
			TimeoutSeconds: 5, PeriodSeconds: period, SuccessThreshold: 1, FailureThreshold: failures,
		}
	}
	// Liveness is lenient: a restart of the agent stalls userspace volumes
	// until they are healed.
	c.LivenessProbe = probe("/healthz", 10, 6)
	// Readiness is asked every 2 s (one local gRPC call): a restarted
	// agent shows Ready, and a rollout moves on to the next node, within
	// 2 s of its heal instead of 10. Unready after 30 s of failures, as
	// before.
	c.ReadinessProbe = probe("/readyz", 2, 15)
}

// keeperReadiness asks the keeper whether it serves the socket itself,
// over HTTP: an exec of the berth binary in the pod took longer than the
// probe's timeout on a slow (emulated) node. The keeper gets no liveness
// probe on purpose: a restart drops every FUSE connection it holds, which
// fails the I/O of every userspace volume on the node.
func keeperReadiness() *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: "/readyz", Port: intstr.FromString(portHealth), Scheme: corev1.URISchemeHTTP,
		}},
		TimeoutSeconds: 5, PeriodSeconds: 10, SuccessThreshold: 1, FailureThreshold: 3,
	}
}

// metricsService renders the headless Service a Prometheus scrape config or
// ServiceMonitor finds a component's pods by: one endpoint per pod, port
// "metrics".
func (r *Reconciler) metricsService(component string, port int32, svc *corev1.Service) {
	setLabels(&svc.ObjectMeta, objectLabels(NodeWide, component))
	svc.Spec.ClusterIP = corev1.ClusterIPNone
	svc.Spec.Selector = selectorLabels(NodeWide, component)
	svc.Spec.Ports = []corev1.ServicePort{{
		Name: portMetrics, Port: port, TargetPort: intstr.FromString(portMetrics), Protocol: corev1.ProtocolTCP,
	}}
}

func (r *Reconciler) metricsServiceMeta(component string) metav1.ObjectMeta {
	m := r.meta(component)
	m.Name += metricsServiceSuffix
	return m
}
