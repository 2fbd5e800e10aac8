package storagecluster

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

func asking(r *corev1.ResourceRequirements) *v1.StorageCluster {
	return &v1.StorageCluster{Spec: v1.StorageClusterSpec{Agent: v1.AgentSpec{Resources: r}}}
}

func list(kv ...string) corev1.ResourceList {
	l := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return l
}

// TestAgentResources: the one agent gets the largest request and limit any
// cluster asks, no limit where any cluster sets none, and never a limit
// below the request (the DaemonSet would be refused).
func TestAgentResources(t *testing.T) {
	for _, tc := range []struct {
		name     string
		clusters []*v1.StorageCluster
		want     corev1.ResourceRequirements
	}{
		{"no cluster: defaults", nil, defaultAgentResources()},
		{"cluster without resources: defaults", []*v1.StorageCluster{asking(nil)}, defaultAgentResources()},
		{"one cluster's own, CPU limit kept",
			[]*v1.StorageCluster{asking(&corev1.ResourceRequirements{Requests: list("cpu", "1"), Limits: list("cpu", "2", "memory", "8Gi")})},
			corev1.ResourceRequirements{Requests: list("cpu", "1"), Limits: list("cpu", "2", "memory", "8Gi")}},
		{"largest of each; a CPU limit dropped where another sets none",
			[]*v1.StorageCluster{
				asking(&corev1.ResourceRequirements{Requests: list("cpu", "1", "memory", "64Mi"), Limits: list("cpu", "2", "memory", "1Gi")}),
				asking(nil),
			},
			corev1.ResourceRequirements{Requests: list("cpu", "1", "memory", "128Mi"), Limits: list("memory", "2Gi")}},
		{"no limit where a cluster requests without one",
			[]*v1.StorageCluster{
				asking(&corev1.ResourceRequirements{Requests: list("memory", "4Gi")}),
				asking(&corev1.ResourceRequirements{Limits: list("memory", "1Gi")}),
			},
			corev1.ResourceRequirements{Requests: list("memory", "4Gi")}},
		{"a limit below the request (the CRD takes it) is raised to it",
			[]*v1.StorageCluster{asking(&corev1.ResourceRequirements{Requests: list("memory", "4Gi"), Limits: list("memory", "1Gi")})},
			corev1.ResourceRequirements{Requests: list("memory", "4Gi"), Limits: list("memory", "4Gi")}},
		{"limits only: both kept, largest",
			[]*v1.StorageCluster{
				asking(&corev1.ResourceRequirements{Limits: list("memory", "1Gi")}),
				asking(&corev1.ResourceRequirements{Requests: list("memory", "3Gi"), Limits: list("memory", "3Gi")}),
			},
			corev1.ResourceRequirements{Requests: list("memory", "3Gi"), Limits: list("memory", "3Gi")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := agentResources(tc.clusters); !equality.Semantic.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
