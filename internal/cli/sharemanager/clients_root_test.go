package sharemanager_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// TestShareManagerFollowsItsClients runs the share manager against a real
// API server with --share-manager: ganesha starts with the ShareManager's
// clients, a change of spec.clients reaches its export without a restart
// (same pid), and each list applied is reported on the Lease for the
// controller (berth.io/share-clients).
func TestShareManagerFollowsItsClients(t *testing.T) {
	env, e, kubeconfig, cs := apiShareEnv(t)
	ctx := context.Background()
	sm := &v1.ShareManager{ObjectMeta: metav1.ObjectMeta{Name: e.volume, Namespace: "default"},
		Spec: v1.ShareManagerSpec{Volume: e.volume, Image: "berth", Clients: []v1.ShareClient{{Node: "node-1", Addresses: []string{"10.7.0.1"}}}}}
	if err := env.Client.Create(ctx, sm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), sm) })
	e.start(t, "--kubeconfig", kubeconfig, "--lease-namespace", "default", "--lease-name", e.volume,
		"--lease-holder", "share-manager-pod-1", "--lease-duration", "3s", "--share-manager", e.volume)
	conf := filepath.Join(e.stateDir(), "ganesha.conf")
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s; log:\n%s", what, e.log())
			}
		}
	}
	clients := func() string {
		b, _ := os.ReadFile(conf)
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "Clients = "); ok {
				return v
			}
		}
		return ""
	}
	reported := func() string {
		l, err := cs.CoordinationV1().Leases("default").Get(ctx, e.volume, metav1.GetOptions{})
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return l.Annotations[v1.ShareClientsAnnotation]
	}
	if got := clients(); got != "10.7.0.1, 127.0.0.1;" {
		t.Errorf("ganesha started with clients %q, want the ShareManager's and its own check address", got)
	}
	waitFor("node-1 not reported on the Lease", func() bool { return reported() == "node-1" })
	pid := e.ganeshaPid(t)

	patch := client.MergeFrom(sm.DeepCopy())
	sm.Spec.Clients = append(sm.Spec.Clients, v1.ShareClient{Node: "node-2", Addresses: []string{"10.7.0.2", "fd00::7"}})
	if err := env.Client.Patch(ctx, sm, patch); err != nil {
		t.Fatal(err)
	}
	waitFor("new client not in ganesha's export", func() bool { return clients() == "10.7.0.1, 10.7.0.2, 127.0.0.1, fd00::7;" })
	waitFor("node-2 not reported on the Lease", func() bool { return reported() == "node-1,node-2" })
	if got := e.ganeshaPid(t); got != pid {
		t.Errorf("ganesha pid %d, was %d: restarted for a client change", got, pid)
	}
	if log := e.log(); !strings.Contains(log, "export clients changed") {
		t.Errorf("no reload logged:\n%s", log)
	}
}
