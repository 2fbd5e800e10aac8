package storagecluster

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestWithEndpointsSecure: the operator's --metrics-secure reaches the
// agent and CSI controller it renders, and only then; the probes stay on
// plain HTTP (kubelet sends no token).
func TestWithEndpointsSecure(t *testing.T) {
	for _, secure := range []bool{false, true} {
		var c corev1.Container
		withEndpoints(&c, AgentMetricsPort, AgentHealthPort, secure)
		if got := slices.Contains(c.Args, "--metrics-secure"); got != secure {
			t.Errorf("secure %v: args %v", secure, c.Args)
		}
		if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Scheme != corev1.URISchemeHTTP {
			t.Errorf("secure %v: readiness probe %+v", secure, c.ReadinessProbe)
		}
	}
}
