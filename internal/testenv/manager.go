package testenv

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// StartManager makes the namespaces, then starts a controller-runtime
// manager on the API server (no metrics listener, development logs to
// stderr) with what setup registers, and returns the function that stops
// it and waits for it. It is for a package's Setup; a test runs its own
// manager with RunManager.
func (e *Env) StartManager(setup func(ctrl.Manager, logr.Logger) error, namespaces ...string) (stop func() error, err error) {
	for _, ns := range namespaces {
		if err := e.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return nil, fmt.Errorf("namespace %s: %w", ns, err)
		}
	}
	log := zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true))
	mgr, err := ctrl.NewManager(e.Config, ctrl.Options{Scheme: e.Scheme, Logger: log, Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		return nil, err
	}
	if err := setup(mgr, log); err != nil {
		return nil, err
	}
	return startInBackground(mgr), nil
}

// RunManager runs, until the test ends, a controller-runtime manager on
// the API server with what setup adds to it. opts gets the API server's
// scheme, the test's logger and no metrics or probe listener; controller
// names may repeat (tests of one package, or -count=N, make the same
// controllers again).
func (e *Env) RunManager(tb testing.TB, opts ctrl.Options, setup func(ctrl.Manager) error) {
	tb.Helper()
	opts.Scheme, opts.Logger = e.Scheme, testr.NewWithInterface(tb, testr.Options{})
	opts.Metrics, opts.HealthProbeBindAddress = metricsserver.Options{BindAddress: "0"}, "0"
	opts.Controller.SkipNameValidation = ptr.To(true)
	mgr, err := ctrl.NewManager(e.Config, opts)
	if err != nil {
		tb.Fatal(err)
	}
	if err := setup(mgr); err != nil {
		tb.Fatal(err)
	}
	stop := startInBackground(mgr)
	tb.Cleanup(func() {
		if err := stop(); err != nil {
			tb.Error(err)
		}
	})
}

// startInBackground starts mgr and returns the function that stops it and
// waits for it.
func startInBackground(mgr ctrl.Manager) func() error {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	return func() error {
		cancel()
		if err := <-done; err != nil {
			return fmt.Errorf("manager: %w", err)
		}
		return nil
	}
}
