package csi

import (
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// TestPlacementByStorageCapacity: the controller places new volumes and
// answers GetCapacity from the agents' CSIStorageCapacity objects in berth's
// namespace; a node that is gone and objects elsewhere do not count.
func TestPlacementByStorageCapacity(t *testing.T) {
	ctx := apiCtx(t, time.Minute)
	const ns, other = "berth-placement", "elsewhere"
	create(ctx, t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	create(ctx, t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}})
	for _, n := range []string{"place-1", "place-2"} {
		create(ctx, t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
	}
	capacity := func(namespace, name, node string, gib int64) {
		create(ctx, t, &storagev1.CSIStorageCapacity{
			ObjectMeta:       metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{v1.NodeLabel: node}},
			NodeTopology:     &metav1.LabelSelector{MatchLabels: map[string]string{v1.TopologyNodeKey: node}},
			StorageClassName: "berth", Capacity: resource.NewQuantity(gib<<30, resource.BinarySI),
		})
	}
	capacity(ns, "c1", "place-1", 2)
	capacity(ns, "c2", "place-2", 5)
	capacity(ns, "c2-userspace", "place-2", 5)
	capacity(ns, "c3", "place-gone", 100) // its node was deleted
	capacity(other, "c4", "place-1", 50)  // not berth's namespace

	s := NewController(env.Client, ControllerConfig{Namespace: ns}, testr.New(t))
	if n, err := s.chooseNode(ctx, nil, 1<<30); err != nil || n != "place-2" {
		t.Errorf("chooseNode(1Gi) = %q, %v; want place-2 (most free)", n, err)
	}
	if _, err := s.chooseNode(ctx, nil, 6<<30); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("chooseNode(6Gi) = %v, want ResourceExhausted", err)
	}
	top := &csi.TopologyRequirement{Preferred: []*csi.Topology{{Segments: map[string]string{v1.TopologyNodeKey: "place-1"}}}}
	if n, err := s.chooseNode(ctx, top, 1<<30); err != nil || n != "place-1" {
		t.Errorf("chooseNode(preferred place-1, 1Gi) = %q, %v; want place-1", n, err)
	}
	if _, err := s.chooseNode(ctx, top, 3<<30); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("chooseNode(preferred place-1, 3Gi) = %v, want ResourceExhausted", err)
	}
	for node, want := range map[string]int64{"": 5 << 30, "place-1": 2 << 30, "place-2": 5 << 30} {
		req := &csi.GetCapacityRequest{}
		if node != "" {
			req.AccessibleTopology = &csi.Topology{Segments: map[string]string{v1.TopologyNodeKey: node}}
		}
		resp, err := s.GetCapacity(ctx, req)
		if err != nil || resp.GetAvailableCapacity() != want {
			t.Errorf("GetCapacity(%q) = %v, %v; want %d", node, resp.GetAvailableCapacity(), err, want)
		}
	}
}
