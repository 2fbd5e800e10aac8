package fence_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/testenv"
)

var (
	env   *testenv.Env
	suite = &testenv.Suite{Setup: func(e *testenv.Env) error { env = e; return nil }}
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain()) // a contender process of the race test
	}
	os.Exit(testenv.Main(m, suite))
}

func ctxT(tb testing.TB) context.Context {
	return testenv.Context(tb, 60*time.Second)
}

// newFencer returns a Fencer on the real API server; events go to a fake
// recorder the test may read (buffered, so that nothing blocks).
func newFencer(t *testing.T) (*fence.Fencer, *record.FakeRecorder) {
	t.Helper()
	suite.Require(t)
	rec := record.NewFakeRecorder(100)
	return fence.New(env.Client, rec, clock.RealClock{}, testr.New(t), fence.Options{}), rec
}

// create makes obj and deletes it when the test ends.
func create(t *testing.T, obj client.Object) {
	t.Helper()
	suite.Require(t)
	if err := env.Client.Create(ctxT(t), obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), obj, client.GracePeriodSeconds(0))
	})
}

func mkNode(t *testing.T, name string, taints ...corev1.Taint) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Taints: taints}}
	create(t, n)
	return n
}

func mkPod(t *testing.T, name, node string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "c", Image: "busybox"}},
		},
	}
	create(t, p)
	return p
}

// deletePod removes a pod object at once (there is no kubelet in envtest).
func deletePod(t *testing.T, p *corev1.Pod) {
	t.Helper()
	if err := env.Client.Delete(ctxT(t), p, client.GracePeriodSeconds(0)); err != nil {
		t.Fatalf("delete pod %s: %v", p.Name, err)
	}
}

// cleanupVolume removes the volume's Attachment and the named nodes'
// stale lists when the test ends.
func cleanupVolume(t *testing.T, volume string, nodes ...string) {
	t.Helper()
	suite.Require(t)
	t.Cleanup(func() {
		ctx := context.Background()
		_ = env.Client.Delete(ctx, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: volume}})
		for _, n := range nodes {
			_ = env.Client.Delete(ctx, &v1.NodeCleanup{ObjectMeta: metav1.ObjectMeta{Name: n}})
		}
	})
}

func stageReq(volume, node string, mode v1.AccessMode) fence.Request {
	dir := "/var/lib/kubelet/plugins/berth.io/staging/" + volume
	return fence.Request{Volume: volume, Node: node, MountDir: dir, StagingPath: dir, AccessMode: mode}
}

func podReq(volume, node string, p *corev1.Pod, mode v1.AccessMode) fence.Request {
	r := stageReq(volume, node, mode)
	r.PodNamespace, r.Pod, r.PodUID = p.Namespace, p.Name, string(p.UID)
	r.MountDir = "/var/lib/kubelet/pods/" + string(p.UID) + "/volumes/kubernetes.io~csi/" + volume + "/mount"
	return r
}

// fakePod is a pod identity for requests that need no pod object.
func fakePod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)}}
}

func getAttachment(t *testing.T, volume string) *v1.Attachment {
	t.Helper()
	return mustGet(t, volume, &v1.Attachment{})
}

func getCleanup(t *testing.T, node string) *v1.NodeCleanup {
	t.Helper()
	return mustGet(t, node, &v1.NodeCleanup{})
}

func mustGet[T client.Object](t *testing.T, name string, obj T) T {
	t.Helper()
	if err := env.Client.Get(ctxT(t), client.ObjectKey{Name: name}, obj); err != nil {
		t.Fatalf("get %T %s: %v", obj, name, err)
	}
	return obj
}

func isExists(err error) bool { return apierrors.IsAlreadyExists(err) }

func clientKey(name string) client.ObjectKey { return client.ObjectKey{Name: name} }
