package csi

import (
	"context"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// storageCluster makes a StorageCluster that goes when the test ends.
func storageCluster(ctx context.Context, t *testing.T, name string, finalizers ...string) *v1.StorageCluster {
	t.Helper()
	sc := &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Finalizers: finalizers}}
	if err := env.Client.Create(ctx, sc); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(sc), sc); err == nil && len(sc.Finalizers) > 0 {
			sc.Finalizers = nil
			_ = env.Client.Update(ctx, sc)
		}
		_ = env.Client.Delete(ctx, sc)
	})
	return sc
}

// TestCreateVolumeNamesItsCluster: one CSI controller serves every
// StorageCluster; the class's storageCluster parameter says which a new
// volume belongs to. A class without it, a cluster that does not exist or
// is being deleted, and a clone across clusters are refused, and nothing is
// made.
func TestCreateVolumeNamesItsCluster(t *testing.T) {
	ctx := apiCtx(t, time.Minute)
	storageCluster(ctx, t, "live")
	doomed := storageCluster(ctx, t, "doomed", "test.berth.io/hold")
	if err := env.Client.Delete(ctx, doomed); err != nil {
		t.Fatal(err)
	}
	src := &v1.Volume{
		ObjectMeta: metav1.ObjectMeta{Name: "cluster-src"},
		Spec: v1.VolumeSpec{StorageCluster: "other", Size: resource.MustParse("4Mi"), AccessMode: v1.ReadWriteOnce,
			VolumeMode: v1.VolumeModeFilesystem, Node: "n"},
	}
	create(ctx, t, src)

	s := apiController(t, ControllerConfig{Wait: 2 * time.Second})
	fsCap := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	clone := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.Name}}}
	for _, tc := range []struct {
		name   string
		params map[string]string
		source *csi.VolumeContentSource
		want   codes.Code
	}{
		{"no-param", nil, nil, codes.InvalidArgument},
		{"unknown", map[string]string{v1.ParamStorageCluster: "nowhere"}, nil, codes.InvalidArgument},
		{"deleting", map[string]string{v1.ParamStorageCluster: "doomed"}, nil, codes.FailedPrecondition},
		{"cross-clone", map[string]string{v1.ParamStorageCluster: "live"}, clone, codes.InvalidArgument},
	} {
		_, err := s.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "cluster-" + tc.name, Parameters: tc.params,
			VolumeCapabilities: []*csi.VolumeCapability{fsCap}, VolumeContentSource: tc.source})
		if status.Code(err) != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: objectName("vol", "cluster-"+tc.name)}, &v1.Volume{}); !apierrors.IsNotFound(err) {
			t.Errorf("%s: a refused create made a Volume (%v)", tc.name, err)
		}
	}
	// The class's cluster is what the Volume records (the agent picks the
	// data dir by it); the request times out waiting for an agent.
	_, _ = s.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "cluster-live", Parameters: map[string]string{v1.ParamStorageCluster: "live"},
		VolumeCapabilities: []*csi.VolumeCapability{fsCap}, AccessibilityRequirements: &csi.TopologyRequirement{
			Requisite: []*csi.Topology{{Segments: map[string]string{v1.TopologyNodeKey: "n"}}}}})
	made := &v1.Volume{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: objectName("vol", "cluster-live")}, made); err == nil {
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), made) })
		if made.Spec.StorageCluster != "live" {
			t.Errorf("Volume's cluster %q, want live", made.Spec.StorageCluster)
		}
	}
}

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

	s := apiController(t, ControllerConfig{Namespace: ns})
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
