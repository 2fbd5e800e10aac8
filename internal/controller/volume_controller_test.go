package controller

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/exec"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/mount"
	"github.com/berth-io/berth/internal/testenv"
)

var (
	env *testenv.Env
	// suite: the tests make loop devices (root).
	suite = &testenv.Suite{Devices: []string{"/dev/loop-control"}, Setup: func(e *testenv.Env) error { env = e; return nil }}
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, suite)) }

// TestDeletedVolumeWaitsUntilUnstaged: a Volume deleted while its node still
// holds it (Attachment entry, then a loop device on the image) keeps its
// image and finalizer, says why, and loses both once unstaged.
func TestDeletedVolumeWaitsUntilUnstaged(t *testing.T) {
	suite.Require(t)
	ctx := context.Background()
	const node = "reconcile-node"
	images, err := backend.NewLocal(t.TempDir(), testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	loop := mount.NewLoop(exec.New())
	r := &VolumeReconciler{Client: env.Client, Node: node, Backend: images, Loop: loop, Log: testr.New(t)}
	vol := &v1.Volume{
		ObjectMeta: metav1.ObjectMeta{Name: "busy-vol", Labels: map[string]string{v1.NodeLabel: node}},
		Spec: v1.VolumeSpec{StorageCluster: "c", Size: resource.MustParse("16Mi"), AccessMode: v1.ReadWriteOnce,
			FSType: "ext4", Node: node},
	}
	if err := env.Client.Create(ctx, vol); err != nil {
		t.Fatal(err)
	}
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(vol)}
	t.Cleanup(func() {
		_ = env.Client.Get(ctx, req.NamespacedName, vol)
		vol.Finalizers = nil
		_ = env.Client.Update(ctx, vol)
		_ = env.Client.Delete(ctx, vol)
	})
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	img, err := images.Get(ctx, vol.Name)
	if err != nil {
		t.Fatalf("image not made: %v", err)
	}
	dev, err := loop.Attach(ctx, img.Path, false)
	if err != nil {
		t.Fatal(err)
	}
	detached := false
	t.Cleanup(func() {
		if !detached {
			_ = loop.Detach(ctx, dev)
		}
	})
	att := &v1.Attachment{
		ObjectMeta: metav1.ObjectMeta{Name: vol.Name},
		Spec: v1.AttachmentSpec{AccessMode: v1.ReadWriteOnce,
			Attachments: []v1.AttachmentEntry{{Node: node, MountDir: "/staging/busy-vol"}}},
	}
	if err := env.Client.Create(ctx, att); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, att) })
	if err := env.Client.Delete(ctx, vol); err != nil {
		t.Fatal(err)
	}

	waits := func(what, why string) {
		t.Helper()
		res, err := r.Reconcile(ctx, req)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if res.RequeueAfter == 0 {
			t.Errorf("%s: no requeue while the volume is in use", what)
		}
		if _, err := images.Get(ctx, vol.Name); err != nil {
			t.Fatalf("%s: image removed while in use: %v", what, err)
		}
		if err := env.Client.Get(ctx, req.NamespacedName, vol); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		cond := meta.FindStatusCondition(vol.Status.Conditions, v1.ConditionReady)
		if len(vol.Finalizers) == 0 || cond == nil || cond.Reason != reasonInUse || !strings.Contains(cond.Message, why) {
			t.Errorf("%s: finalizers %v, condition %+v; want the image finalizer and reason %s naming %q", what, vol.Finalizers, cond, reasonInUse, why)
		}
	}
	waits("attachment held", "/staging/busy-vol")
	if err := env.Client.Delete(ctx, att); err != nil {
		t.Fatal(err)
	}
	// Crash between unmount and detach: the record is gone, the device not.
	waits("loop device attached", dev)

	if err := loop.Detach(ctx, dev); err != nil {
		t.Fatal(err)
	}
	detached = true
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := images.Get(ctx, vol.Name); err == nil {
		t.Error("image left after the volume was unstaged")
	}
	if err := env.Client.Get(ctx, req.NamespacedName, vol); !apierrors.IsNotFound(err) {
		t.Errorf("Volume left after unstage: finalizers %v (%v)", vol.Finalizers, err)
	}
}
