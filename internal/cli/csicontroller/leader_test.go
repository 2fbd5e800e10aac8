package csicontroller

import (
	"context"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend/ceph"
	"github.com/berth-io/berth/internal/capacity"
	"github.com/berth-io/berth/internal/csi"
	"github.com/berth-io/berth/internal/testenv"
)

var (
	env   *testenv.Env
	suite = &testenv.Suite{Setup: func(e *testenv.Env) error { env = e; return nil }}
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, suite)) }

// berthNamespace is where the generated role grants the Lease and the
// capacities (the release namespace).
const berthNamespace = "berth-system"

// replica is one CSI controller's leader-only half: its pool capacity
// publisher, as the csi-controller role's user, reading free bytes that
// name it.
type replica struct {
	free  int64
	reads atomic.Int32
	stop  func() error
}

// start runs the replica's manager until stop or the test's end.
func (r *replica) start(t *testing.T, user string, elect bool) {
	t.Helper()
	rest := env.ComponentConfig(t, "csi-controller", user)
	kc, err := client.New(rest, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	c := Config{Namespace: berthNamespace, LeaderElect: elect, Rest: rest, Log: testr.New(t).WithName(user)}
	mgr, err := c.leaderOnly(env.Scheme, &csi.PoolCapacityPublisher{
		Client: kc, Namespace: berthNamespace, Log: c.Log,
		Usage: func(context.Context, *v1.StorageCluster) (ceph.PoolUsage, error) {
			r.reads.Add(1)
			return ceph.PoolUsage{Free: r.free}, nil
		},
		Schedule: capacity.Schedule{Interval: 100 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var stopped bool
	r.stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-done
	}
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("%s: %v", user, err)
		}
	})
}

// poolClass makes a ceph StorageCluster and a class of it (the pool is
// never reached: replicas read their own free bytes).
func poolClass(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	for _, obj := range []client.Object{
		&v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.StorageClusterSpec{
			Backend: v1.BackendCeph, DataDir: "/srv/berth",
			Ceph: &v1.CephSpec{Monitors: []v1.CephMonitor{"127.0.0.1:3300"}, Pool: "rbd",
				SecretRef: v1.CephSecretReference{Name: "ceph", Namespace: "default"}},
		}},
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: v1.DriverName,
			Parameters: map[string]string{v1.ParamStorageCluster: name}},
	} {
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatalf("create %T %s: %v", obj, name, err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
	}
}

// capacityIs waits until the class's pool capacity holds free bytes.
func capacityIs(t *testing.T, class string, free int64, within time.Duration) {
	t.Helper()
	testenv.Eventually(t, within, "pool capacity of "+class, func(ctx context.Context) (bool, error) {
		var c storagev1.CSIStorageCapacity
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: berthNamespace, Name: csi.PoolCapacityName(class)}, &c)
		return err == nil && c.Capacity != nil && c.Capacity.Value() == free, client.IgnoreNotFound(err)
	})
}

// Two replicas electing, with the generated role: only the one holding the
// Lease publishes (the other never reads a pool), and when it stops (its
// Lease released) the other takes over within a retry period.
func TestPoolCapacityLeaderOnly(t *testing.T) {
	suite.Require(t)
	ctx := testenv.Context(t, 2*time.Minute)
	const class = "leader-pool"
	poolClass(ctx, t, class)

	a, b := &replica{free: 1 << 30}, &replica{free: 2 << 30}
	a.start(t, "csi-controller-a", true)
	capacityIs(t, class, 1<<30, 30*time.Second)
	b.start(t, "csi-controller-b", true)
	// Many of a's rounds (100 ms apart) while b waits for the Lease.
	before := a.reads.Load()
	time.Sleep(3 * time.Second)
	if n := b.reads.Load(); n != 0 {
		t.Fatalf("the replica without the Lease read its pools %d times, want none", n)
	}
	if n := a.reads.Load() - before; n < 5 {
		t.Fatalf("the leader read its pools %d times in 3s, want every 100ms", n)
	}
	capacityIs(t, class, 1<<30, time.Second)
	var lease coordinationv1.Lease
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: berthNamespace, Name: leaderElectionID}, &lease); err != nil {
		t.Fatalf("the Lease: %v", err)
	}

	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	// Released on stop: b needs one retry period (2s), not a lease
	// duration (15s).
	capacityIs(t, class, 2<<30, 10*time.Second)
}

// Without leader election (one replica) the publisher runs at once and
// takes no Lease.
func TestPoolCapacityNoElection(t *testing.T) {
	suite.Require(t)
	ctx := testenv.Context(t, time.Minute)
	const class = "single-pool"
	poolClass(ctx, t, class)
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: berthNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// Any Lease left by the other test goes first.
	_ = env.Client.Delete(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: berthNamespace, Name: leaderElectionID}})

	r := &replica{free: 3 << 30}
	r.start(t, "csi-controller-single", false)
	capacityIs(t, class, 3<<30, 30*time.Second)
	err := env.Client.Get(ctx, client.ObjectKey{Namespace: berthNamespace, Name: leaderElectionID}, &coordinationv1.Lease{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("a Lease without leader election: %v", err)
	}
}
