package pinned_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/controller/pinned"
	"github.com/berth-io/berth/internal/testenv"
)

var (
	env   *testenv.Env
	suite = &testenv.Suite{Setup: func(e *testenv.Env) error { env = e; return nil }}
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, suite)) }

// world is a local volume on node "lost-1" with its PV, claim and a pod that
// waits for it on another node, in the real API server.
type world struct {
	ctx    context.Context
	c      client.Client
	cs     kubernetes.Interface
	node   *corev1.Node
	vol    *v1.Volume
	claim  *corev1.PersistentVolumeClaim
	waiter *corev1.Pod
}

func newWorld(t *testing.T, suffix string, backend v1.Backend) *world {
	suite.Require(t)
	ctx := testenv.Context(t, time.Minute)
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{ctx: ctx, c: env.Client, cs: cs}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	spec := v1.StorageClusterSpec{Backend: backend}
	if backend == v1.BackendCeph {
		// The API requires a ceph cluster's connection; nothing dials it here.
		spec.Ceph = &v1.CephSpec{Monitors: []v1.CephMonitor{"127.0.0.1:3300"}, Pool: "rbd",
			SecretRef: v1.CephSecretReference{Name: "ceph", Namespace: "berth-system"}}
	}
	sc := &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "sc-" + suffix}, Spec: spec}
	must(w.c.Create(ctx, sc))
	w.node = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "lost-" + suffix}}
	must(w.c.Create(ctx, w.node))
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app-" + suffix}}
	must(w.c.Create(ctx, ns))
	pvName := "pvc-" + suffix
	w.vol = &v1.Volume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        "vol-" + suffix,
			Labels:      map[string]string{v1.NodeLabel: w.node.Name},
			Annotations: map[string]string{v1.CSINameAnnotation: pvName},
		},
		Spec: v1.VolumeSpec{StorageCluster: sc.Name, Size: resource.MustParse("32Mi"), Node: w.node.Name},
	}
	must(w.c.Create(ctx, w.vol))
	fs := corev1.PersistentVolumeFilesystem
	w.claim = &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: ns.Name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, VolumeMode: &fs, VolumeName: pvName,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("32Mi")}},
		},
	}
	must(w.c.Create(ctx, w.claim))
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("32Mi")},
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, VolumeMode: &fs,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: v1.DriverName, VolumeHandle: w.vol.Name,
			}},
			ClaimRef: &corev1.ObjectReference{Namespace: ns.Name, Name: w.claim.Name, UID: w.claim.UID},
		},
	}
	must(w.c.Create(ctx, pv))
	pod := func(name, node string) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns.Name},
			Spec: corev1.PodSpec{
				NodeName:   node,
				Containers: []corev1.Container{{Name: "c", Image: "busybox"}},
				Volumes: []corev1.Volume{{Name: "d", VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: w.claim.Name},
				}}},
			},
		}
		must(w.c.Create(ctx, p))
		return p
	}
	w.waiter = pod("waiter", "")
	pod("old", w.node.Name) // the pod left on the lost node is not told
	return w
}

func (w *world) reporter(t *testing.T) (*pinned.Reporter, func()) {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: w.cs.CoreV1().Events("")})
	rec := b.NewRecorder(env.Scheme, corev1.EventSource{Component: "berth-operator"})
	return &pinned.Reporter{Client: w.c, Reader: w.c, Recorder: rec, Log: testr.New(t)}, b.Shutdown
}

func (w *world) reconcile(t *testing.T, r *pinned.Reporter) ctrl.Result {
	t.Helper()
	res, err := r.Reconcile(w.ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: w.node.Name}})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func (w *world) taint(t *testing.T, on bool) {
	t.Helper()
	orig := w.node.DeepCopy()
	w.node.Spec.Taints = nil
	if on {
		w.node.Spec.Taints = []corev1.Taint{{Key: corev1.TaintNodeOutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}}
	}
	if err := w.c.Patch(w.ctx, w.node, client.MergeFrom(orig)); err != nil {
		t.Fatal(err)
	}
}

func (w *world) condition(t *testing.T) *metav1.Condition {
	t.Helper()
	vol := &v1.Volume{}
	if err := w.c.Get(w.ctx, client.ObjectKeyFromObject(w.vol), vol); err != nil {
		t.Fatal(err)
	}
	return meta.FindStatusCondition(vol.Status.Conditions, pinned.ConditionNodeAvailable)
}

// eventsOn waits for a VolumePinnedToLostNode event on the object (kind/name in
// ns) and returns its message; "" when none came within wait.
func (w *world) eventOn(t *testing.T, ns, kind, name string, within time.Duration) string {
	t.Helper()
	msg := ""
	_ = wait.PollUntilContextTimeout(w.ctx, 100*time.Millisecond, within, true, func(ctx context.Context) (bool, error) {
		list, err := w.cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=" + kind + ",involvedObject.name=" + name + ",reason=" + pinned.EventPinned,
		})
		if err != nil || len(list.Items) == 0 {
			return false, nil
		}
		msg = list.Items[0].Message
		return true, nil
	})
	return msg
}

// A local volume whose node is tainted out-of-service: the Volume says so in
// a condition, and the claim and the pod waiting elsewhere get a Warning that
// names the node and says the data stays there; the pod on the lost node
// gets none. The taint lifted, the condition turns True.
func TestLocalVolumeOnLostNodeIsExplained(t *testing.T) {
	w := newWorld(t, "a", v1.BackendLocal)
	r, stop := w.reporter(t)
	defer stop()

	if res := w.reconcile(t, r); res.RequeueAfter != 0 || w.condition(t) != nil {
		t.Fatalf("a node in service: requeue %v, condition %+v", res.RequeueAfter, w.condition(t))
	}

	w.taint(t, true)
	if res := w.reconcile(t, r); res.RequeueAfter == 0 {
		t.Error("a lost node's volumes are not looked at again")
	}
	cond := w.condition(t)
	if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != pinned.ReasonNodeOutOfService {
		t.Fatalf("condition %+v", cond)
	}
	for _, want := range []string{"node lost-a", "local backend", "cannot move", "data stays"} {
		if !strings.Contains(cond.Message, want) {
			t.Errorf("condition message %q lacks %q", cond.Message, want)
		}
	}
	for _, o := range []struct{ kind, name string }{{"Pod", "waiter"}, {"PersistentVolumeClaim", "data"}} {
		if msg := w.eventOn(t, w.claim.Namespace, o.kind, o.name, 10*time.Second); !strings.Contains(msg, "node lost-a") {
			t.Errorf("%s %s: event %q", o.kind, o.name, msg)
		}
	}
	if msg := w.eventOn(t, w.claim.Namespace, "Pod", "old", time.Second); msg != "" {
		t.Errorf("the pod on the lost node was told: %q", msg)
	}

	w.taint(t, false)
	w.reconcile(t, r)
	if cond := w.condition(t); cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != pinned.ReasonNodeInService {
		t.Fatalf("after the taint is lifted: condition %+v", cond)
	}
}

// A deleted Node object counts as lost too.
func TestLocalVolumeOnDeletedNode(t *testing.T) {
	w := newWorld(t, "b", v1.BackendLocal)
	r, stop := w.reporter(t)
	defer stop()
	if err := w.c.Delete(w.ctx, w.node); err != nil {
		t.Fatal(err)
	}
	w.reconcile(t, r)
	if cond := w.condition(t); cond == nil || cond.Reason != pinned.ReasonNodeGone || !strings.Contains(cond.Message, "gone") {
		t.Fatalf("condition %+v", cond)
	}
}

// A backend whose volumes can move (ceph) is not the Reporter's business:
// the fence breaks the lock and the pod moves.
func TestMovableVolumeIsLeftAlone(t *testing.T) {
	w := newWorld(t, "c", v1.BackendCeph)
	r, stop := w.reporter(t)
	defer stop()
	w.taint(t, true)
	w.reconcile(t, r)
	if cond := w.condition(t); cond != nil {
		t.Fatalf("condition on a movable volume: %+v", cond)
	}
	if msg := w.eventOn(t, w.claim.Namespace, "Pod", "waiter", time.Second); msg != "" {
		t.Errorf("event on a movable volume's pod: %q", msg)
	}
}
