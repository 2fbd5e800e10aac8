package storagecluster

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

func asking(r *v1.AgentResources) *v1.StorageCluster {
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
// below the request (the DaemonSet would be refused); a cluster's own ask
// replaces the defaults whole and is read as a pod's.
func TestAgentResources(t *testing.T) {
	for _, tc := range []struct {
		name     string
		clusters []*v1.StorageCluster
		want     corev1.ResourceRequirements
	}{
		{"no cluster: defaults", nil, defaultAgentResources()},
		{"cluster without resources: defaults", []*v1.StorageCluster{asking(nil)}, defaultAgentResources()},
		{"empty resources: defaults", []*v1.StorageCluster{asking(&v1.AgentResources{Requests: corev1.ResourceList{}})}, defaultAgentResources()},
		{"one cluster's own, CPU limit kept",
			[]*v1.StorageCluster{asking(&v1.AgentResources{Requests: list("cpu", "1"), Limits: list("cpu", "2", "memory", "8Gi")})},
			corev1.ResourceRequirements{Requests: list("cpu", "1", "memory", "8Gi"), Limits: list("cpu", "2", "memory", "8Gi")}},
		{"requests only: no limits",
			[]*v1.StorageCluster{asking(&v1.AgentResources{Requests: list("cpu", "1")})},
			corev1.ResourceRequirements{Requests: list("cpu", "1")}},
		{"largest of each; a CPU limit dropped where another sets none",
			[]*v1.StorageCluster{
				asking(&v1.AgentResources{Requests: list("cpu", "1", "memory", "64Mi"), Limits: list("cpu", "2", "memory", "1Gi")}),
				asking(nil),
			},
			corev1.ResourceRequirements{Requests: list("cpu", "1", "memory", "128Mi"), Limits: list("memory", "2Gi")}},
		{"a limit without a request requests the limit",
			[]*v1.StorageCluster{asking(&v1.AgentResources{Limits: list("memory", "4Gi")}), asking(nil)},
			corev1.ResourceRequirements{Requests: list("cpu", "100m", "memory", "4Gi"), Limits: list("memory", "4Gi")}},
		{"no limit where a cluster requests without one",
			[]*v1.StorageCluster{
				asking(&v1.AgentResources{Requests: list("memory", "4Gi")}),
				asking(&v1.AgentResources{Limits: list("memory", "1Gi")}),
			},
			corev1.ResourceRequirements{Requests: list("memory", "4Gi")}},
		{"a limit below the request (the CRD takes it) is raised to it",
			[]*v1.StorageCluster{asking(&v1.AgentResources{Requests: list("memory", "4Gi"), Limits: list("memory", "1Gi")})},
			corev1.ResourceRequirements{Requests: list("memory", "4Gi"), Limits: list("memory", "4Gi")}},
		{"a negative amount is none",
			[]*v1.StorageCluster{asking(&v1.AgentResources{Requests: list("cpu", "-1", "memory", "1Gi"), Limits: list("memory", "-2Gi")})},
			corev1.ResourceRequirements{Requests: list("memory", "1Gi")}},
		{"a zero limit is none, not a cap at the request",
			[]*v1.StorageCluster{asking(&v1.AgentResources{Requests: list("cpu", "1"), Limits: list("cpu", "0", "memory", "1Gi")})},
			corev1.ResourceRequirements{Requests: list("cpu", "1", "memory", "1Gi"), Limits: list("memory", "1Gi")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := agentResources(tc.clusters); !equality.Semantic.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestGoneClusterAsksTheDefaults: a deleted cluster whose Volumes the
// agent still serves counts with the default ask (its spec is gone); once
// its Volumes are gone it counts no more.
func TestGoneClusterAsksTheDefaults(t *testing.T) {
	small := asking(&v1.AgentResources{Requests: list("cpu", "10m", "memory", "32Mi"), Limits: list("memory", "64Mi")})
	small.Name, small.Spec.DataDir = "small", "/var/lib/berth-small"
	kept := map[string]string{"small": "/var/lib/berth-small", "gone": "/var/lib/berth-gone"}
	for _, tc := range []struct {
		name        string
		withVolumes map[string]bool
		want        corev1.ResourceRequirements
	}{
		{"gone cluster with volumes: defaults merged", map[string]bool{"gone": true},
			corev1.ResourceRequirements{Requests: list("cpu", "100m", "memory", "128Mi"), Limits: list("memory", "2Gi")}},
		{"gone cluster without volumes: the served cluster's own", nil,
			corev1.ResourceRequirements{Requests: list("cpu", "10m", "memory", "32Mi"), Limits: list("memory", "64Mi")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := planNodeWide([]v1.StorageCluster{*small}, kept, tc.withVolumes)
			if got := p.agentResources; !equality.Semantic.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestResourcesChangedSeesARemovedLimit: createOrUpdate keeps an object
// whose read fields merely hold more than was rendered, so a CPU limit
// taken out must be reported as a change; the same resources, spelled
// otherwise, are none.
func TestResourcesChangedSeesARemovedLimit(t *testing.T) {
	ds := func(r corev1.ResourceRequirements) *appsv1.DaemonSet {
		d := &appsv1.DaemonSet{}
		d.Spec.Template.Spec.Containers = []corev1.Container{{Resources: r}}
		return d
	}
	render := func(d *appsv1.DaemonSet, r corev1.ResourceRequirements) func() {
		return func() { d.Spec.Template.Spec.Containers[0].Resources = r }
	}
	read := ds(corev1.ResourceRequirements{Requests: list("cpu", "100m"), Limits: list("cpu", "2", "memory", "2Gi")})
	if !resourcesChanged(&read.Spec.Template, render(read, corev1.ResourceRequirements{Requests: list("cpu", "100m"), Limits: list("memory", "2Gi")})) {
		t.Error("a removed CPU limit is not a change")
	}
	same := ds(corev1.ResourceRequirements{Requests: list("memory", "1024Mi")})
	if resourcesChanged(&same.Spec.Template, render(same, corev1.ResourceRequirements{Requests: list("memory", "1Gi"), Limits: corev1.ResourceList{}})) {
		t.Error("the same resources, spelled otherwise, are a change")
	}
}

// TestCSIControllerResourcesMerged: berth's CSI controller container gets
// the defaults when no cluster sets spec.csiController.resources, else what
// the clusters ask, merged as the agent's are.
func TestCSIControllerResourcesMerged(t *testing.T) {
	ctrl := func(r *corev1.ResourceRequirements) *v1.StorageCluster {
		return &v1.StorageCluster{Spec: v1.StorageClusterSpec{CSIController: v1.CSIControllerSpec{Resources: r}}}
	}
	for _, tc := range []struct {
		name     string
		clusters []*v1.StorageCluster
		want     corev1.ResourceRequirements
	}{
		{"no cluster: defaults", nil, controllerResources},
		{"cluster without resources: defaults", []*v1.StorageCluster{ctrl(nil)}, controllerResources},
		{"one cluster's own", []*v1.StorageCluster{ctrl(&corev1.ResourceRequirements{Requests: list("memory", "1Gi")})},
			corev1.ResourceRequirements{Requests: list("memory", "1Gi")}},
		{"largest of each; no CPU limit where one sets none",
			[]*v1.StorageCluster{ctrl(&corev1.ResourceRequirements{Requests: list("cpu", "1", "memory", "16Mi"), Limits: list("memory", "1Gi")}), ctrl(nil)},
			corev1.ResourceRequirements{Requests: list("cpu", "1", "memory", "32Mi"), Limits: list("memory", "1Gi")}},
		{"the agent's resources are not the controller's",
			[]*v1.StorageCluster{{Spec: v1.StorageClusterSpec{Agent: v1.AgentSpec{Resources: &v1.AgentResources{Requests: list("cpu", "4")}}}}},
			controllerResources},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := csiControllerResources(tc.clusters); !equality.Semantic.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
