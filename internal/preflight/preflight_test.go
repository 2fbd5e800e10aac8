package preflight_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/preflight"
	"github.com/berth-io/berth/internal/testenv"
)

var (
	env   *testenv.Env
	suite = &testenv.Suite{Setup: func(e *testenv.Env) error { env = e; return nil }}
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, suite)) }

// create makes obj (and its status, which create drops) and deletes it
// when the test ends.
func create(t *testing.T, ctx context.Context, obj client.Object, status func()) {
	t.Helper()
	if err := env.Client.Create(ctx, obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
	if status != nil {
		status()
		if err := env.Client.Status().Update(ctx, obj); err != nil {
			t.Fatalf("status of %T %s: %v", obj, obj.GetName(), err)
		}
	}
}

// TestPreflightNamesWhatMustSettle: a quiet system passes; each thing an
// upgrade should not interrupt is named, and only those.
func TestPreflightNamesWhatMustSettle(t *testing.T) {
	suite.Require(t)
	ctx := testenv.Context(t, time.Minute)
	const ns = "berth-system"
	_ = env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})

	sc := &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "pf"}}
	create(t, ctx, sc, func() { sc.Status.Phase = v1.StorageClusterReady })
	ok := &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "pf-ok"}, Spec: v1.VolumeSpec{StorageCluster: "pf", Size: resource.MustParse("1Mi"), Node: "n1"}}
	create(t, ctx, ok, func() { ok.Status.State = v1.VolumeAvailable })
	share := &v1.ShareManager{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pf-share"}, Spec: v1.ShareManagerSpec{Volume: "pf-ok", Image: "berth"}}
	create(t, ctx, share, func() { share.Status.State = v1.ShareRunning })
	create(t, ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "pf-n1"}}, nil)

	r, err := preflight.Check(ctx, env.Client, ns)
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() {
		t.Fatalf("a quiet system: %v", r.Findings)
	}

	// Now everything that should settle first.
	bad := &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "pf-bad"}, Spec: v1.VolumeSpec{StorageCluster: "pf", Size: resource.MustParse("1Mi"), Node: "n1"}}
	create(t, ctx, bad, func() { bad.Status.State, bad.Status.Message = v1.VolumeError, "image missing" })
	growing := &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "pf-growing"}, Spec: v1.VolumeSpec{StorageCluster: "pf", Size: resource.MustParse("1Mi"), Node: "n1"}}
	create(t, ctx, growing, func() { growing.Status.State = v1.VolumeExpanding })
	moving := &v1.ShareManager{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pf-moving"}, Spec: v1.ShareManagerSpec{Volume: "pf-bad", Image: "berth"}}
	create(t, ctx, moving, func() { moving.Status.State = v1.ShareStarting })
	create(t, ctx, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: "pf-ok"}, Spec: v1.AttachmentSpec{AccessMode: v1.ReadWriteOnce,
		Attachments: []v1.AttachmentEntry{{Node: "pf-n1", MountDir: "/var/lib/kubelet/x"}},
		TakeOvers: []v1.TakeOverRequest{{AttachmentEntry: v1.AttachmentEntry{Node: "pf-n2", MountDir: "/var/lib/kubelet/x"},
			AccessMode: v1.ReadWriteOnce, RequestedAt: metav1.Now()}}}}, nil)
	create(t, ctx, &v1.NodeCleanup{ObjectMeta: metav1.ObjectMeta{Name: "pf-n1"}, Spec: v1.NodeCleanupSpec{Entries: []v1.StaleAttachment{
		{Volume: "pf-ok", MountDir: "/var/lib/kubelet/x", Reason: v1.ReasonNodeGone, FoundAt: metav1.Now()}}}}, nil)
	create(t, ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "pf-n2"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{
		{Key: corev1.TaintNodeOutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}}}}, nil)
	sc2 := &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "pf-new"}}
	create(t, ctx, sc2, func() { sc2.Status.Phase = v1.StorageClusterProgressing })

	r, err = preflight.Check(ctx, env.Client, ns)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range r.Findings {
		got = append(got, f.Kind+" "+f.Name)
		t.Log(f)
	}
	want := []string{"Attachment pf-ok", "Node pf-n2", "NodeCleanup pf-n1", "ShareManager berth-system/pf-moving",
		"StorageCluster pf-new", "Volume pf-bad", "Volume pf-growing"}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Errorf("findings %q, want %q", got, want)
	}
	if r.Volumes != 3 || r.Shares != 2 || r.StorageClusters != 2 {
		t.Errorf("counts: %d volumes, %d shares, %d clusters", r.Volumes, r.Shares, r.StorageClusters)
	}
}
