package csi

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/utils/exec"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

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
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme, Logger: testr.New(t),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		// Other tests of this package run controllers of the same names.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := (&controller.VolumeReconciler{Client: mgr.GetClient(), Node: node, Backend: images,
		Loop: mount.NewLoop(exec.New()), Log: testr.New(t)}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	if err := (&controller.SnapshotReconciler{Client: mgr.GetClient(), Node: node, Backend: images, Log: testr.New(t)}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() { stop(); <-done })
}

// apiController is a CSI controller on the test API server, logging to t.
func apiController(t *testing.T, cfg ControllerConfig) *Controller {
	return NewController(env.Client, cfg, testr.New(t))
}
