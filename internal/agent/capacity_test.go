package agent

import (
	"context"
	"testing"

	"github.com/go-logr/logr"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// TestCapacitySkipsCephClusters: a class of a local StorageCluster gets this
// node's free bytes; a class of a ceph one gets no capacity from the node
// (its data dir defaults to the local cluster's, so Free would answer) and
// Free is not asked. The real path with the agent's RBAC and admission
// policy is deploy's TestAgentWritesOnlyItsOwnNodesRecords.
func TestCapacitySkipsCephClusters(t *testing.T) {
	class := func(name, cluster string) *storagev1.StorageClass {
		return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: v1.DriverName,
			Parameters: map[string]string{v1.ParamStorageCluster: cluster}}
	}
	cluster := func(name string, b v1.Backend) *v1.StorageCluster {
		return &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1.StorageClusterSpec{Backend: b, DataDir: "/var/lib/berth"}}
	}
	c := fakeAPI(t,
		class("disk", "local"), class("pool", "rbd"),
		cluster("local", v1.BackendLocal), cluster("rbd", v1.BackendCeph),
	).Build()
	var asked []string
	r := &CapacityReporter{Client: c, Node: "node-a", Namespace: "berth-system", Log: logr.Discard(),
		Free: func(_ context.Context, cluster string) (int64, error) {
			asked = append(asked, cluster)
			return 5 << 30, nil
		}}
	ctx := context.Background()
	n, err := r.report(ctx)
	if err != nil || n != 1 {
		t.Fatalf("report = %d, %v; want 1 published", n, err)
	}
	if len(asked) != 1 || asked[0] != "local" {
		t.Errorf("Free asked for %v, want [local]", asked)
	}
	var caps storagev1.CSIStorageCapacityList
	if err := c.List(ctx, &caps, client.InNamespace("berth-system")); err != nil {
		t.Fatal(err)
	}
	// Only the local class's: none for the ceph class.
	if len(caps.Items) != 1 || caps.Items[0].Name != CapacityName("node-a", "disk") || caps.Items[0].Capacity.Value() != 5<<30 {
		t.Errorf("capacities: %+v, want only the local class's, 5Gi", caps.Items)
	}
}
