package agent

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	nodeagent "github.com/berth-io/berth/internal/agent"
	"github.com/berth-io/berth/internal/capacity"
	"github.com/berth-io/berth/internal/testenv"
)

// TestCapacityPublishedForANewClass: with an hour's interval and a class
// already published (so no quick re-run for want of a class), a local
// class added later gets this node's capacity within seconds, through the
// StorageClass informer, which watches with the agent's own role.
func TestCapacityPublishedForANewClass(t *testing.T) {
	env := suite.Require(t)
	ctx := testenv.Context(t, time.Minute)
	const ns, node = "capacity-new-class", "capacity-node"
	create := func(obj client.Object) {
		t.Helper()
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
	}
	class := func(name string) *storagev1.StorageClass {
		return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: v1.DriverName,
			Parameters: map[string]string{v1.ParamStorageCluster: "local-" + name}}
	}
	create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	create(class("capacity-first"))
	classes, err := kubernetes.NewForConfig(env.ComponentConfig(t, "agent", "berth-agent-capacity-test"))
	if err != nil {
		t.Fatal(err)
	}
	r := &nodeagent.CapacityReporter{Client: env.Client, Node: node, Namespace: ns,
		Free:     func(context.Context, string) (int64, error) { return 7 << 30, nil },
		Schedule: capacity.Schedule{Classes: classes, Interval: time.Hour}, Log: testr.New(t)}
	testenv.Serve(t, "capacity reporter", r.Start)
	published := func(cls string) func(ctx context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			var c storagev1.CSIStorageCapacity
			err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: nodeagent.CapacityName(node, cls)}, &c)
			return err == nil && c.Capacity != nil && c.Capacity.Value() == 7<<30, client.IgnoreNotFound(err)
		}
	}
	testenv.Eventually(t, 10*time.Second, "the first class's capacity", published("capacity-first"))
	// Past the informer's first list, so that the class is new to it.
	time.Sleep(2 * time.Second)
	create(class("capacity-second"))
	testenv.Eventually(t, 10*time.Second, "the new class's capacity, long before the hour", published("capacity-second"))
}
