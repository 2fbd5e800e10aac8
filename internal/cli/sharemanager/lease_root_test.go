package sharemanager_test

import (
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/testenv"
)

// TestShareManagerHoldsItsLease runs the share manager against a real API
// server: it holds and renews its Lease while serving, and on SIGTERM stops
// ganesha, unmounts and clears the holder, so the controller sees a clean
// stop at once.
func TestShareManagerHoldsItsLease(t *testing.T) {
	_, e, kubeconfig, cs := apiShareEnv(t)
	sm := e.start(t, "--kubeconfig", kubeconfig, "--lease-namespace", "default", "--lease-name", "share-"+e.volume,
		"--lease-holder", "share-manager-pod-1", "--lease-duration", "3s")
	ctx := context.Background()
	get := func() (string, time.Time) {
		l, err := cs.CoordinationV1().Leases("default").Get(ctx, "share-"+e.volume, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return ptr.Deref(l.Spec.HolderIdentity, ""), l.Spec.RenewTime.Time
	}
	holder, first := get()
	if holder != "share-manager-pod-1" {
		t.Fatalf("lease holder %q while serving", holder)
	}
	time.Sleep(2500 * time.Millisecond)
	if _, later := get(); !later.After(first) {
		t.Errorf("lease not renewed: %v then %v", first, later)
	}
	sm.Stop(syscall.SIGTERM, 20*time.Second)
	if code := sm.ExitCode(); code != 0 {
		t.Fatalf("exit %d on SIGTERM:\n%s", code, e.log())
	}
	if holder, _ := get(); holder != "" {
		t.Errorf("lease still held by %q after a clean stop", holder)
	}
}

// TestShareManagerRenewsWhileStarting: a share manager whose start takes
// longer than its Lease (here it waits for its ShareManager to appear,
// as a slow mkfs or fsck on a busy node would hold it) renews the Lease
// meanwhile and then serves: the controller must not read a slow start as
// a dead share manager and fail it over again and again.
func TestShareManagerRenewsWhileStarting(t *testing.T) {
	env, e, kubeconfig, cs := apiShareEnv(t)
	ctx := context.Background()
	lease := "starting-" + e.volume // a Lease of its own: taken once
	sm := &v1.ShareManager{ObjectMeta: metav1.ObjectMeta{Name: e.volume, Namespace: "default"},
		Spec: v1.ShareManagerSpec{Volume: e.volume, Image: "berth"}}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), sm) })
	// Three Lease durations after the start, the ShareManager appears.
	created := make(chan error, 1)
	time.AfterFunc(6*time.Second, func() { created <- env.Client.Create(ctx, sm) })
	start := time.Now()
	e.start(t, "--kubeconfig", kubeconfig, "--lease-namespace", "default", "--lease-name", lease,
		"--lease-holder", "share-manager-pod-1", "--lease-duration", "2s", "--share-manager", e.volume)
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	l, err := cs.CoordinationV1().Leases("default").Get(ctx, lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := ptr.Deref(l.Spec.HolderIdentity, ""); h != "share-manager-pod-1" {
		t.Errorf("lease holder %q once serving", h)
	}
	if n := ptr.Deref(l.Spec.LeaseTransitions, 0); n != 0 {
		t.Errorf("lease changed holders %d times", n)
	}
	if log := e.log(); strings.Contains(log, "lease lost") || strings.Contains(log, "share lease lost") {
		t.Errorf("lease lost during the start:\n%s", log)
	}
	t.Logf("serving %s after the start", time.Since(start).Round(time.Millisecond))
}

// apiShareEnv is a share environment with the test API server: its
// kubeconfig for the share manager and a clientset for the test.
func apiShareEnv(t *testing.T) (*testenv.Env, *shareEnv, string, kubernetes.Interface) {
	t.Helper()
	env := suite.Require(t)
	e := newShareEnv(t)
	kubeconfig := filepath.Join(e.dir, "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return env, e, kubeconfig, cs
}
