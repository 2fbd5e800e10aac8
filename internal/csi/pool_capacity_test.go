package csi

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend/ceph"
	"github.com/berth-io/berth/internal/capacity"
	"github.com/berth-io/berth/internal/metrics"
	"github.com/berth-io/berth/internal/testenv"
)

// poolFrees is a fake pool read: free bytes or an error per cluster.
type poolFrees struct {
	mu   sync.Mutex
	free map[string]int64
	err  error
}

func (f *poolFrees) set(cluster string, n int64, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.free[cluster], f.err = n, err
}

// read answers a pool read; the fake pool stores half what it can still
// take.
func (f *poolFrees) read(_ context.Context, sc *v1.StorageCluster) (ceph.PoolUsage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return ceph.PoolUsage{}, f.err
	}
	return ceph.PoolUsage{Free: f.free[sc.Name], Used: f.free[sc.Name] / 2}, nil
}

// poolCapacitySetup makes the namespace ns and a ceph StorageCluster named
// cluster (never reached: the tests read pools through poolFrees).
func poolCapacitySetup(ctx context.Context, t *testing.T, ns, cluster string) {
	t.Helper()
	create(ctx, t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	create(ctx, t, &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: cluster}, Spec: v1.StorageClusterSpec{
		Backend: v1.BackendCeph, DataDir: "/srv/berth",
		Ceph: &v1.CephSpec{Monitors: []v1.CephMonitor{"127.0.0.1:3300"}, Pool: "rbd",
			SecretRef: v1.CephSecretReference{Name: "ceph", Namespace: "default"}},
	}})
}

// startPublisher runs p.Start until the test ends.
func startPublisher(t *testing.T, p *PoolCapacityPublisher) {
	testenv.Serve(t, "pool capacity publisher", p.Start)
}

// waitPoolCapacity waits up to within for the capacity of class cls in ns to
// be free bytes.
func waitPoolCapacity(ctx context.Context, t *testing.T, ns, cls string, free int64, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for {
		var c storagev1.CSIStorageCapacity
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: PoolCapacityName(cls)}, &c)
		if err == nil && c.Capacity != nil && c.Capacity.Value() == free {
			return
		}
		select {
		case <-deadline:
			t.Fatalf("capacity of %s not %d within %v (last: %v, %v)", cls, free, within, c.Capacity, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// The publisher writes one capacity per ceph class, matching every node,
// with the pool's free bytes; updates it; keeps it while Ceph is unreachable;
// removes it with its class; and writes none for a local class.
func TestPoolCapacityPublisher(t *testing.T) {
	ctx := apiCtx(t, time.Minute)
	const ns = "pool-capacity"
	poolCapacitySetup(ctx, t, ns, "pool-ceph")
	create(ctx, t, &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "pool-local"}, Spec: v1.StorageClusterSpec{
		Backend: v1.BackendLocal, DataDir: "/srv/berth"}})
	class := func(name, cluster string) *storagev1.StorageClass {
		c := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: v1.DriverName,
			Parameters: map[string]string{v1.ParamStorageCluster: cluster}}
		create(ctx, t, c)
		return c
	}
	cephA, cephB := class("pool-ceph-a", "pool-ceph"), class("pool-ceph-b", "pool-ceph")
	local := class("pool-local", "pool-local")

	frees := &poolFrees{free: map[string]int64{}}
	frees.set("pool-ceph", 10<<30, nil)
	reg := prometheus.NewRegistry()
	pools, err := metrics.NewPools(reg)
	if err != nil {
		t.Fatal(err)
	}
	// The pool's gauges hold its last read: free, and half that used.
	wantGauges := func(free int64) {
		t.Helper()
		got, err := testenv.Gathered(reg)
		if err != nil {
			t.Fatal(err)
		}
		f := testenv.Series("berth_ceph_pool_free_bytes", "storage_cluster", "pool-ceph")
		u := testenv.Series("berth_ceph_pool_used_bytes", "storage_cluster", "pool-ceph")
		if len(got) != 2 || got[f] != float64(free) || got[u] != float64(free/2) {
			t.Errorf("pool gauges %v, want free %d and used %d of pool-ceph only", got, free, free/2)
		}
	}
	p := &PoolCapacityPublisher{Client: env.Client, Namespace: ns, Usage: frees.read, Metrics: pools, Log: testr.New(t)}
	get := func(cls string) *storagev1.CSIStorageCapacity {
		t.Helper()
		var c storagev1.CSIStorageCapacity
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: PoolCapacityName(cls)}, &c)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			t.Fatalf("get capacity of %s: %v", cls, err)
		}
		return &c
	}
	want := func(cls string, free int64) {
		t.Helper()
		c := get(cls)
		switch {
		case c == nil:
			t.Fatalf("no capacity for class %s", cls)
		case c.StorageClassName != cls:
			t.Errorf("capacity of %s names class %s", cls, c.StorageClassName)
		case c.NodeTopology == nil || len(c.NodeTopology.MatchLabels) != 0 || len(c.NodeTopology.MatchExpressions) != 0:
			t.Errorf("capacity of %s: topology %v, want the empty selector", cls, c.NodeTopology)
		case c.Capacity == nil || c.Capacity.Value() != free:
			t.Errorf("capacity of %s: %v, want %d", cls, c.Capacity, free)
		}
	}

	if err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	want(cephA.Name, 10<<30)
	want(cephB.Name, 10<<30)
	wantGauges(10 << 30)
	if c := get(local.Name); c != nil {
		t.Errorf("a local class got a pool capacity: %v", c)
	}
	var all storagev1.CSIStorageCapacityList
	if err := env.Client.List(ctx, &all, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(all.Items) != 2 {
		t.Errorf("%d capacities, want 2 (the ceph classes')", len(all.Items))
	}

	frees.set("pool-ceph", 7<<30, nil)
	if err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	want(cephA.Name, 7<<30)

	// Ceph unreachable: the last value stays, neither 0 nor removed.
	frees.set("pool-ceph", 0, errors.New("rados: connection timed out"))
	if err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	want(cephA.Name, 7<<30)
	want(cephB.Name, 7<<30)
	wantGauges(7 << 30)

	frees.set("pool-ceph", 5<<30, nil)
	if err := env.Client.Delete(ctx, cephB); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	want(cephA.Name, 5<<30)
	if c := get(cephB.Name); c != nil {
		t.Errorf("the deleted class %s keeps its capacity", cephB.Name)
	}
}

// Start publishes at once and then on its interval, until its context ends.
func TestPoolCapacityPublisherStart(t *testing.T) {
	ctx := apiCtx(t, time.Minute)
	const ns = "pool-capacity-start"
	poolCapacitySetup(ctx, t, ns, "pool-start")
	create(ctx, t, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "pool-start"}, Provisioner: v1.DriverName,
		Parameters: map[string]string{v1.ParamStorageCluster: "pool-start"}})
	frees := &poolFrees{free: map[string]int64{"pool-start": 1 << 30}}
	startPublisher(t, &PoolCapacityPublisher{Client: env.Client, Namespace: ns, Usage: frees.read,
		Schedule: capacity.Schedule{Interval: 100 * time.Millisecond}, Log: testr.New(t)})
	waitPoolCapacity(ctx, t, ns, "pool-start", 1<<30, 30*time.Second)
	frees.set("pool-start", 2<<30, nil)
	waitPoolCapacity(ctx, t, ns, "pool-start", 2<<30, 30*time.Second)
}

// With a watching client, Start publishes the capacity of a class added
// after it started at once, not an Interval later: the first pod of a new
// WaitForFirstConsumer class is not left unschedulable meanwhile.
func TestPoolCapacityPublisherNewClass(t *testing.T) {
	ctx := apiCtx(t, time.Minute)
	const ns = "pool-capacity-new-class"
	poolCapacitySetup(ctx, t, ns, "pool-new-class")
	classes, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	frees := &poolFrees{free: map[string]int64{"pool-new-class": 3 << 30}}
	// An hour: only the watch can publish within the test.
	startPublisher(t, &PoolCapacityPublisher{Client: env.Client, Namespace: ns, Usage: frees.read,
		Schedule: capacity.Schedule{Classes: classes, Interval: time.Hour}, Log: testr.New(t)})
	// Past Start's first rounds, so that the class is new to it.
	time.Sleep(2 * time.Second)
	create(ctx, t, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "pool-new-class"}, Provisioner: v1.DriverName,
		Parameters: map[string]string{v1.ParamStorageCluster: "pool-new-class"}})
	waitPoolCapacity(ctx, t, ns, "pool-new-class", 3<<30, 10*time.Second)
}
