package fence_test

import (
	"context"
	"errors"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend/ceph"
	"github.com/berth-io/berth/internal/fence"
)

// fakeCeph is one Ceph cluster's fencing, as CephClusters opens it.
type fakeCeph struct {
	*fakeBlocklister
	cfg ceph.Config
}

func (f *fakeCeph) Close() {}

func TestCephClustersRouteToTheVolumesCluster(t *testing.T) {
	suite.Require(t)
	ns := "default"
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cc-key"},
		Data: map[string][]byte{v1.CephSecretUserID: []byte("berth"), v1.CephSecretUserKey: []byte("c2VjcmV0")}})
	create(t, &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "cc-ceph"}, Spec: v1.StorageClusterSpec{Backend: v1.BackendCeph,
		Ceph: &v1.CephSpec{Monitors: []v1.CephMonitor{"10.9.0.1:3300"}, Pool: "rbd", SecretRef: v1.CephSecretReference{Name: "cc-key", Namespace: ns}}}})
	create(t, &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "vol-cc"}, Spec: v1.VolumeSpec{StorageCluster: "cc-ceph", Size: resource.MustParse("1Mi")}})

	clusters := map[string]*fakeCeph{}
	cc := &fence.CephClusters{C: env.Client, Namespace: ns, Log: testr.New(t),
		Open: func(_ context.Context, cfg ceph.Config, _ logr.Logger) (ceph.Fencing, error) {
			f := &fakeCeph{fakeBlocklister: newFakeBlocklister(), cfg: cfg}
			clusters[cfg.Monitors] = f
			return f, nil
		}}
	if err := cc.FenceClients(ctxT(t), "vol-cc", []string{"10.0.0.7:0/1"}); err != nil {
		t.Fatal(err)
	}
	f := clusters["[v2:10.9.0.1:3300]"]
	if f == nil || f.cfg.Client != "berth" || f.cfg.Key != "c2VjcmV0" || f.cfg.Pool != "rbd" || !f.isFenced("10.0.0.7:0/1") {
		t.Fatalf("fenced through %+v", clusters)
	}
	if err := cc.UnfenceClients(ctxT(t), []string{"10.0.0.7:0/1"}); err != nil {
		t.Fatal(err)
	}
	if f := clusters["[v2:10.9.0.1:3300]"]; len(f.unfenced) != 1 {
		t.Errorf("unfenced %v", f.unfenced)
	}
	if err := cc.FenceClients(ctxT(t), "vol-missing", []string{"10.0.0.7:0/1"}); err == nil {
		t.Error("a volume that does not exist was fenced")
	}

	// Without the ceph build tag (or Ceph down) the error says so.
	cc.Open = nil
	if err := cc.FenceClients(ctxT(t), "vol-cc", []string{"10.0.0.7:0/1"}); err == nil {
		t.Error("fenced with no Ceph to reach")
	} else if !errors.Is(err, ceph.ErrNotBuilt) {
		t.Logf("real open: %v", err)
	}
}

// TestCephClustersForOnlyCephVolumes: the operator's take-overs fence a
// ceph volume's clients and no other's; a volume it cannot read is an
// error, never "not ceph" (its holds would move unfenced).
func TestCephClustersForOnlyCephVolumes(t *testing.T) {
	suite.Require(t)
	create(t, &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "for-ceph"}, Spec: v1.StorageClusterSpec{Backend: v1.BackendCeph,
		Ceph: &v1.CephSpec{Monitors: []v1.CephMonitor{"10.9.0.1:3300"}, Pool: "rbd", SecretRef: v1.CephSecretReference{Name: "none", Namespace: "default"}}}})
	create(t, &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "for-local"}})
	create(t, &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "vol-for-ceph"}, Spec: v1.VolumeSpec{StorageCluster: "for-ceph", Size: resource.MustParse("1Mi")}})
	create(t, &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "vol-for-local"}, Spec: v1.VolumeSpec{StorageCluster: "for-local", Size: resource.MustParse("1Mi"), Node: "n1"}})
	cc := &fence.CephClusters{C: env.Client, Namespace: "default", Log: testr.New(t)}
	if bl, err := cc.For(ctxT(t), "vol-for-ceph"); err != nil || bl == nil {
		t.Errorf("ceph volume: %v, %v; want the clusters' Blocklister", bl, err)
	}
	if bl, err := cc.For(ctxT(t), "vol-for-local"); err != nil || bl != nil {
		t.Errorf("local volume: %v, %v; want none", bl, err)
	}
	if _, err := cc.For(ctxT(t), "vol-for-nothing"); err == nil {
		t.Error("a volume that does not exist: no error")
	}
}
