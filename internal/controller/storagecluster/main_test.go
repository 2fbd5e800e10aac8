package storagecluster_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/controller/storagecluster"
	"github.com/berth-io/berth/internal/testenv"
)

const namespace = "berth-system"

var (
	env *testenv.Env
	// suite is the API server with the StorageCluster controller running.
	suite = &testenv.Suite{Setup: startManager, Teardown: func(failed bool) error { return stopManager(failed) }}
	// stopManager stops the controller and waits for it.
	stopManager = func(bool) error { return nil }
	// afterTests run once every test is done (a test Ceph to stop).
	afterTests []func()
	opts       = storagecluster.Options{
		Namespace:                namespace,
		Image:                    "berth.local/berth:test",
		ImagePullPolicy:          corev1.PullNever,
		ImagePullSecrets:         []corev1.LocalObjectReference{{Name: "regcred"}},
		ProvisionerImage:         "berth.local/csi-provisioner:v5.3.0",
		ResizerImage:             "berth.local/csi-resizer:v1.14.0",
		SnapshotterImage:         "berth.local/csi-snapshotter:v8.3.0",
		KubeletDir:               "/var/lib/k8s-test/kubelet",
		VolumePluginDir:          "/usr/libexec/kubernetes/kubelet-plugins/volume/exec",
		AgentServiceAccount:      "berth-agent",
		ControllerServiceAccount: "berth-csi-controller",
		APIServerHost:            "10.1.2.3",
		APIServerPort:            "6443",
		DefaultStorageClass:      true,
	}
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, suite)) }

func startManager(e *testenv.Env) error {
	env = e
	stop, err := env.StartManager(func(mgr ctrl.Manager, log logr.Logger) error {
		r := &storagecluster.Reconciler{Client: mgr.GetClient(), Options: opts, Log: log.WithName("storagecluster"), CleanupPoll: 200 * time.Millisecond,
			Direct: env.Client, Recorder: mgr.GetEventRecorderFor("berth-operator"), CephConnectTimeout: cephConnectTimeout,
			NetworkRecheck: 300 * time.Millisecond}
		if err := r.SetupWithManager(mgr); err != nil {
			return err
		}
		h := &storagecluster.HolderEvents{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorderFor("berth-operator"),
			Namespace: namespace, Log: log.WithName("holder-events")}
		return h.SetupWithManager(mgr)
	}, namespace)
	if err != nil {
		return err
	}
	stopManager = func(bool) error {
		for _, f := range afterTests {
			f()
		}
		return stop()
	}
	return nil
}

func testCtx(t *testing.T) context.Context {
	return testenv.Context(t, 30*time.Second)
}

// reconcilerOn is a StorageCluster reconciler of the test's own, apart from
// the manager's, working through c.
func reconcilerOn(c client.Client) *storagecluster.Reconciler {
	return &storagecluster.Reconciler{Client: c, Options: opts, Log: logr.Discard()}
}

// interceptedClient is a client of the test's own on the API server whose
// calls pass through funcs (to count, change or keep writes).
func interceptedClient(t *testing.T, funcs interceptor.Funcs) client.WithWatch {
	t.Helper()
	watching, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return interceptor.NewClient(watching, funcs)
}

// eventually polls cond until it holds or 20s pass.
func eventually(t *testing.T, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, what, cond)
}

// get waits until obj exists and reads it.
func get(t *testing.T, obj client.Object) {
	t.Helper()
	env.WaitGet(t, 20*time.Second, obj)
}

// gone waits until obj is deleted (its finalizers done).
func gone(t *testing.T, obj client.Object) {
	t.Helper()
	eventually(t, fmt.Sprintf("%T %s gone", obj, obj.GetName()), func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
}

// newCluster creates a StorageCluster and, at the end of the test, deletes it
// with its own objects (envtest runs no garbage collector); the node-wide
// set stays, as it does in a real cluster.
func newCluster(t *testing.T, name string, spec v1.StorageClusterSpec) *v1.StorageCluster {
	t.Helper()
	sc := &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
	if err := env.Client.Create(testCtx(t), sc); err != nil {
		t.Fatalf("create StorageCluster: %v", err)
	}
	t.Cleanup(func() { removeCluster(t, name) })
	return sc
}

func removeCluster(t *testing.T, name string) {
	ctx := context.Background()
	sc := &v1.StorageCluster{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, sc); err == nil {
		sc.Finalizers = nil
		_ = env.Client.Update(ctx, sc)
		_ = env.Client.Delete(ctx, sc)
	}
	owned := []client.Object{
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: storagecluster.StorageClassName(name, v1.MounterKernel)}},
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: storagecluster.StorageClassName(name, v1.MounterUserspace)}},
		&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: storagecluster.HolderName(name), Namespace: namespace}},
	}
	// A reconcile in flight may recreate an object once: delete until all
	// are gone, so that the next test finds none controlled by this cluster.
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		gone := apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKey{Name: name}, &v1.StorageCluster{}))
		for _, o := range owned {
			if err := env.Client.Delete(ctx, o); !apierrors.IsNotFound(err) {
				gone = false
			}
		}
		return gone, nil
	})
	if err != nil {
		t.Errorf("cleanup of %s: %v", name, err)
	}
}
