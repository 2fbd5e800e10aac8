package sharemanager_test

import (
	"context"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// TestShareManagerHoldsItsLease runs the share manager against a real API
// server: it holds and renews its Lease while serving, and on SIGTERM stops
// ganesha, unmounts and clears the holder, so the controller sees a clean
// stop at once.
func TestShareManagerHoldsItsLease(t *testing.T) {
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
