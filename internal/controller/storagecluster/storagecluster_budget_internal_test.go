package storagecluster

import (
	"testing"

	"k8s.io/utils/ptr"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// TestControllerScale: the one CSI controller runs the most replicas any
// cluster asks, electing a leader unless every cluster turns that off, and
// always with more than one replica.
func TestControllerScale(t *testing.T) {
	ask := func(replicas int32, elect *bool) *v1.StorageCluster {
		c := v1.CSIControllerSpec{LeaderElection: elect}
		if replicas > 0 {
			c.Replicas = ptr.To(replicas)
		}
		return &v1.StorageCluster{Spec: v1.StorageClusterSpec{CSIController: c}}
	}
	off := ptr.To(false)
	for _, tc := range []struct {
		name     string
		clusters []*v1.StorageCluster
		want     controllerScale
	}{
		{"no cluster", nil, controllerScale{1, true}},
		{"defaults", []*v1.StorageCluster{ask(0, nil)}, controllerScale{1, true}},
		{"one off", []*v1.StorageCluster{ask(1, off)}, controllerScale{1, false}},
		{"one off, one default", []*v1.StorageCluster{ask(0, off), ask(0, nil)}, controllerScale{1, true}},
		{"most replicas", []*v1.StorageCluster{ask(2, nil), ask(3, nil), ask(0, nil)}, controllerScale{3, true}},
		{"replicas of another", []*v1.StorageCluster{ask(1, off), ask(2, nil)}, controllerScale{2, true}},
		// The CRD refuses this ask; one stored before the rule still elects.
		{"more than one replica elects", []*v1.StorageCluster{ask(2, off)}, controllerScale{2, true}},
	} {
		if got := controllerScaleOf(tc.clusters); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
