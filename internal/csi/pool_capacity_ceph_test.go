//go:build ceph

package csi

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// The controller's PoolUsage reads a real pool: the publisher writes its
// free bytes for a ceph class.
func TestPoolCapacityOnRealCeph(t *testing.T) {
	suite.Require(t)
	c := testCeph(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cephStorageCluster(ctx, t, c, "ceph-pool-capacity", c.Monitors)
	const ns = "pool-capacity-ceph"
	create(ctx, t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	create(ctx, t, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "ceph-pool-capacity"}, Provisioner: v1.DriverName,
		Parameters: map[string]string{v1.ParamStorageCluster: "ceph-pool-capacity"}})
	s := apiController(t, ControllerConfig{})
	defer s.Close()
	p := &PoolCapacityPublisher{Client: env.Client, Namespace: ns, Usage: s.PoolUsage, Log: testr.New(t)}
	if err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	var got storagev1.CSIStorageCapacity
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: PoolCapacityName("ceph-pool-capacity")}, &got); err != nil {
		t.Fatal(err)
	}
	if got.Capacity == nil || got.Capacity.Value() <= 0 {
		t.Errorf("pool capacity %v, want > 0", got.Capacity)
	}
	t.Logf("pool free: %v", got.Capacity)
}
