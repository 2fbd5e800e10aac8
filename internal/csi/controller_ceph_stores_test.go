package csi

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend/ceph"
)

// cephSecret makes a ceph client's Secret in namespace default, gone when
// the test ends.
func cephSecret(ctx context.Context, t *testing.T, name, client, key string) *corev1.Secret {
	t.Helper()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		StringData: map[string]string{v1.CephSecretUserID: client, v1.CephSecretUserKey: key}}
	create(ctx, t, secret)
	return secret
}

// cephCluster is a ceph StorageCluster named name on pool at monitors,
// its client's key in the Secret of the same name in "default".
func cephCluster(name, monitors, pool string) *v1.StorageCluster {
	return &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.StorageClusterSpec{
		Backend: v1.BackendCeph, DataDir: "/srv/berth",
		Ceph: &v1.CephSpec{Monitors: []v1.CephMonitor{v1.CephMonitor(monitors)}, Pool: pool,
			SecretRef: v1.CephSecretReference{Name: name, Namespace: "default"}},
	}}
}

// countedStore is a ceph.Store that only counts its Close calls (the real
// connection path is TestCephUnreachableOnRealCeph's).
type countedStore struct {
	ceph.Store
	closed int
}

func (c *countedStore) Close() { c.closed++ }

// A changed Secret replaces a cluster's connection; the old one is closed
// once the last call using it is done, and not before.
func TestCephConnectionReplacedWhenSecretChanges(t *testing.T) {
	ctx := apiCtx(t, time.Minute)
	secret := cephSecret(ctx, t, "ceph-conns", "berth", "AQBkey1==")
	sc := cephCluster(secret.Name, "127.0.0.1:3300", "rbd")
	sc.Generation = 1
	var opened []*countedStore
	p := &cephStores{log: testr.New(t), namespace: "default", open: func(context.Context, ceph.Config, logr.Logger) (ceph.Store, error) {
		s := &countedStore{}
		opened = append(opened, s)
		return s, nil
	}}
	_, release1, err := p.get(ctx, env.Client, sc)
	if err != nil {
		t.Fatal(err)
	}
	_, release2, err := p.get(ctx, env.Client, sc)
	if err != nil {
		t.Fatal(err)
	}
	if len(opened) != 1 {
		t.Fatalf("opened %d connections for one cluster, want 1", len(opened))
	}
	secret.StringData = map[string]string{v1.CephSecretUserKey: "AQBkey2=="}
	if err := env.Client.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	_, release3, err := p.get(ctx, env.Client, sc)
	if err != nil {
		t.Fatal(err)
	}
	if len(opened) != 2 || opened[0].closed != 0 {
		t.Fatalf("after the Secret changed: %d opened, old closed %d times; want 2, 0 (in use)", len(opened), opened[0].closed)
	}
	release1()
	release1() // a second release is a no-op
	if opened[0].closed != 0 {
		t.Error("closed while a call still uses it")
	}
	release2()
	if opened[0].closed != 1 || opened[1].closed != 0 {
		t.Errorf("closed %d / %d times, want 1 / 0", opened[0].closed, opened[1].closed)
	}
	release3()
	p.close()
	if opened[1].closed != 1 {
		t.Errorf("shutdown closed the current connection %d times, want 1", opened[1].closed)
	}
}

// A StorageCluster whose Secret is outside berth's namespace is refused
// before the Secret is read: berth's role grants Secrets there only (F10).
func TestCephSecretOutsideBerthsNamespaceRefused(t *testing.T) {
	ctx := apiCtx(t, time.Minute)
	secret := cephSecret(ctx, t, "ceph-elsewhere", "berth", "AQBkey1==")
	sc := cephCluster(secret.Name, "127.0.0.1:3300", "rbd")
	p := &cephStores{log: testr.New(t), namespace: "berth-system", open: func(context.Context, ceph.Config, logr.Logger) (ceph.Store, error) {
		t.Error("a connection opened with a Secret outside berth's namespace")
		return &countedStore{}, nil
	}}
	_, _, err := p.get(ctx, env.Client, sc)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "berth reads Secrets only in its own namespace, berth-system") {
		t.Errorf("get = %v, want FailedPrecondition naming berth's namespace", err)
	}
}
