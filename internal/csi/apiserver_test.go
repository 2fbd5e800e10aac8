package csi

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/utils/exec"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-io/berth/internal/controller"
	"github.com/berth-io/berth/internal/mount"
	"github.com/berth-io/berth/internal/testenv"
)

// apiCtx needs the test API server and returns a context that ends with
// the test, or after d.
func apiCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	suite.Require(t)
	return testenv.Context(t, d)
}

// create makes obj on the test API server and deletes it when the test
// ends.
func create(ctx context.Context, t *testing.T, obj client.Object) {
	t.Helper()
	if err := env.Client.Create(ctx, obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
}

// runNodeReconcilers runs, until the test ends, the Volume and Snapshot
// reconcilers an agent on node runs, with a real backend: what the CSI
// controller waits for when it makes volumes and snapshots.
func runNodeReconcilers(t *testing.T, node string, images controller.Backend) {
	t.Helper()
	env.RunManager(t, ctrl.Options{}, func(mgr ctrl.Manager) error {
		if err := (&controller.VolumeReconciler{Client: mgr.GetClient(), Node: node, Backend: images,
			Loop: mount.NewLoop(exec.New()), Log: testr.New(t)}).SetupWithManager(mgr); err != nil {
			return err
		}
		return (&controller.SnapshotReconciler{Client: mgr.GetClient(), Node: node, Backend: images, Log: testr.New(t)}).SetupWithManager(mgr)
	})
}

// apiController is a CSI controller on the test API server, logging to t;
// berth's namespace is "default" unless cfg names one (the ceph tests keep
// their Secrets there).
func apiController(t *testing.T, cfg ControllerConfig) *Controller {
	if cfg.Namespace == "" {
		cfg.Namespace = "default"
	}
	return NewController(env.Client, cfg, testr.New(t))
}
