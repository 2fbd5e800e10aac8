package sharemanager_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/berth-io/berth/internal/controller/sharemanager"
	"github.com/berth-io/berth/internal/metrics"
	"github.com/berth-io/berth/internal/testenv"
)

// namespace is the running controllers'. roleNamespace is the one the
// generated operator roles name, where the RBAC test runs its own
// reconcilers, apart from the running ones.
const (
	namespace     = "berth-share"
	roleNamespace = "berth-system"
)

// The API server with both controllers of the package running.
var (
	env   *testenv.Env
	suite = &testenv.Suite{Setup: startManager, Teardown: stopManager}
	// stop stops the controllers and waits for them, once started.
	stop func() error
	// shareMetrics holds the running controller's failover metrics.
	shareMetrics = prometheus.NewRegistry()
	// clk is the controllers' clock: Leases lapse when a test steps it.
	clk  = clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	opts = sharemanager.Options{
		Namespace: namespace, Image: "berth.local/berth:test", ImagePullPolicy: corev1.PullNever,
		ServiceAccount: "berth-share-manager", ImagePullSecrets: []corev1.LocalObjectReference{{Name: "regcred"}},
	}
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, suite)) }

func startManager(e *testenv.Env) error {
	env = e
	var err error
	stop, err = env.StartManager(func(mgr ctrl.Manager, log logr.Logger) error {
		shares, err := metrics.NewShare(shareMetrics, sharemanager.FailoverReasons...)
		if err != nil {
			return err
		}
		r := &sharemanager.Reconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Options: opts, Clock: clk,
			Recorder: mgr.GetEventRecorderFor("berth-operator"), Metrics: shares, Log: log.WithName("sharemanager")}
		if err := r.SetupWithManager(mgr); err != nil {
			return err
		}
		v := &sharemanager.VolumeReconciler{Client: mgr.GetClient(), Options: opts, Log: log.WithName("volume-share")}
		return v.SetupWithManager(mgr)
	}, namespace, roleNamespace)
	return err
}

func stopManager(bool) error {
	if stop == nil {
		return nil
	}
	return stop()
}

func testCtx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

// waitLimit bounds each wait for the controllers.
const waitLimit = 20 * time.Second
