// Package csicontroller is the `berth csi-controller` command: the CSI
// Identity and Controller services, run beside the standard CSI sidecars.
package csicontroller

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/capacity"
	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/cli/kube"
	"github.com/berth-io/berth/internal/csi"
	"github.com/berth-io/berth/internal/metrics"
	"github.com/berth-io/berth/internal/scheme"
	"github.com/berth-io/berth/internal/version"
)

// Config of the CSI controller.
type Config struct {
	Endpoint  string
	Namespace string
	Wait      time.Duration
	// CapacityInterval is how often the pools' capacities are published.
	CapacityInterval time.Duration
	// LeaderElect: only the replica holding a Lease in Namespace
	// publishes the pools' capacities; off, this one publishes at once.
	// The Deployment turns it on with the sidecars' leader election.
	LeaderElect bool
	// MetricsAddr serves /metrics, HealthAddr /healthz and /readyz; "0"
	// turns either off.
	MetricsAddr string
	HealthAddr  string
	// MetricsSecure serves /metrics over HTTPS to authorized readers only
	// (metrics.SecureHandler).
	MetricsSecure bool
	Rest          *rest.Config
	Log           logr.Logger
}

// The controller's endpoints: ports apart from the agent's, so that both
// may share a host network.
const (
	DefaultMetricsAddr = ":9743"
	DefaultHealthAddr  = ":9744"
)

// leaderElectionID names the Lease the CSI controller replicas compete for
// (the sidecars hold Leases of their own).
const leaderElectionID = "berth-csi-controller.berth.io"

// Leader election of what one replica alone runs, and the events it records.
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=berth-system,resources=leases,verbs=get;create;update
// +kubebuilder:rbac:groups="",namespace=berth-system,resources=events,verbs=create;patch

// A secure metrics endpoint (--metrics-secure) asks the API server who
// each reader is and whether it may get /metrics.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// Run serves until ctx ends, or until one of its servers fails.
func (c Config) Run(ctx context.Context) error {
	s, err := scheme.New()
	if err != nil {
		return err
	}
	// With watch: the controller waits for the agents by watching.
	kc, err := client.NewWithWatch(c.Rest, client.Options{Scheme: s})
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	// The pool capacities follow StorageClasses through an informer.
	classes, err := kubernetes.NewForConfig(c.Rest)
	if err != nil {
		return fmt.Errorf("kubernetes clientset: %w", err)
	}
	// The leader-only manager serves no metrics: a registry of its own,
	// served by promhttp.
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return err
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return err
	}
	ops, err := metrics.NewOps(reg, metrics.BoundaryCSI)
	if err != nil {
		return err
	}
	pools, err := metrics.NewPools(reg)
	if err != nil {
		return err
	}
	if err := metrics.NewBuildInfo(reg, version.Get()); err != nil {
		return err
	}
	ml, metricsHandler, err := c.metricsEndpoint(reg)
	if err != nil {
		return err
	}
	hl, err := metrics.Listen(c.HealthAddr)
	if err != nil {
		closeAll(ml)
		return fmt.Errorf("health: %w", err)
	}
	l, err := csi.Listen(c.Endpoint)
	if err != nil {
		closeAll(ml, hl)
		return err
	}
	ctrl := csi.NewController(kc, csi.ControllerConfig{Namespace: c.Namespace, Wait: c.Wait}, c.Log.WithName("controller"))
	defer ctrl.Close()
	srv := csi.NewServer(c.Log, ops, csi.Services{
		Identity:   csi.NewIdentity(v1.DriverName, version.Get().Version, true, nil),
		Controller: ctrl,
	})
	c.Log.Info("serving CSI controller", "endpoint", c.Endpoint,
		"metrics", c.MetricsAddr, "health", c.HealthAddr, "leaderElection", c.LeaderElect)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := func() error { return dialable(l.Addr()) }
	leader, err := c.leaderOnly(s, &csi.PoolCapacityPublisher{
		Client: kc, Namespace: c.Namespace, Usage: ctrl.PoolUsage, Metrics: pools,
		Schedule: capacity.Schedule{Classes: classes, Interval: c.CapacityInterval}, Log: c.Log.WithName("pool-capacity"),
	})
	if err != nil {
		closeAll(ml, hl, l)
		return err
	}
	runs := []func() error{
		func() error { return csi.Serve(ctx, srv, l) },
		// A lost Lease ends it with an error: the process exits, as the
		// operator's does, so that two replicas never publish at once.
		func() error { return leader.Start(ctx) },
		func() error { return metrics.Serve(ctx, ml, metricsHandler) },
		func() error { return metrics.Serve(ctx, hl, metrics.HealthHandler(ready)) },
	}
	errs := make(chan error, len(runs))
	for _, run := range runs {
		go func() {
			err := run()
			cancel() // one server down takes the process down: kubelet restarts it
			errs <- err
		}()
	}
	var all []error
	for range runs {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}

// leaderOnly is a controller-runtime manager that runs what one replica
// alone may run (the pools' capacities: every replica would write the same
// objects, racing on their updates): with LeaderElect, once it holds the
// Lease in Namespace, given back when ctx ends; without, at once. It serves
// no metrics or probes (Run serves those) and caches nothing.
func (c Config) leaderOnly(s *runtime.Scheme, runs ...manager.Runnable) (manager.Manager, error) {
	mgr, err := manager.New(c.Rest, manager.Options{
		Scheme:                        s,
		Logger:                        c.Log.WithName("leader"),
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:        "0",
		LeaderElection:                c.LeaderElect,
		LeaderElectionID:              leaderElectionID,
		LeaderElectionNamespace:       c.Namespace,
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return nil, fmt.Errorf("manager: %w", err)
	}
	for _, r := range runs {
		// A plain Runnable needs leader election: the manager starts it
		// once elected.
		if err := mgr.Add(r); err != nil {
			return nil, err
		}
	}
	return mgr, nil
}

// dialable tells whether the CSI socket accepts a connection: the gRPC
// server is serving.
func dialable(addr net.Addr) error {
	conn, err := net.DialTimeout(addr.Network(), addr.String(), time.Second)
	if err != nil {
		return fmt.Errorf("CSI endpoint not accepting connections: %w", err)
	}
	return conn.Close()
}

func closeAll(ls ...net.Listener) {
	for _, l := range ls {
		if l != nil {
			_ = l.Close()
		}
	}
}

// Command is `berth csi-controller`.
func Command() cli.Command {
	return kube.NewCommand("csi-controller", "serve the CSI Identity and Controller services", func(fs *flag.FlagSet) kube.Run {
		var cfg Config
		fs.StringVar(&cfg.Endpoint, "endpoint", "unix:///csi/csi.sock", "CSI endpoint (unix socket)")
		ns := os.Getenv("POD_NAMESPACE")
		if ns == "" {
			ns = "berth-system"
		}
		fs.StringVar(&cfg.Namespace, "namespace", ns, "berth's namespace, where agents and this controller publish CSIStorageCapacity objects (default $POD_NAMESPACE or berth-system)")
		fs.DurationVar(&cfg.Wait, "agent-wait", 2*time.Minute, "how long a call waits for the node agent")
		fs.DurationVar(&cfg.CapacityInterval, "capacity-interval", time.Minute, "how often the ceph pools' CSIStorageCapacity objects are refreshed")
		fs.BoolVar(&cfg.LeaderElect, "leader-elect", false, "publish the pools' capacities only while holding a Lease in --namespace (with more than one replica)")
		fs.StringVar(&cfg.MetricsAddr, "metrics-addr", DefaultMetricsAddr, "Prometheus /metrics listen address; 0 disables")
		fs.StringVar(&cfg.HealthAddr, "health-addr", DefaultHealthAddr, "/healthz and /readyz listen address; 0 disables")
		fs.BoolVar(&cfg.MetricsSecure, "metrics-secure", false, "serve /metrics over HTTPS to readers the API server authenticates and allows get on /metrics")
		return func(ctx context.Context, log logr.Logger, rest *rest.Config) error {
			cfg.Log, cfg.Rest = log, rest
			return cfg.Run(ctx)
		}
	})
}

// metricsEndpoint opens the metrics listener and its handler of reg: plain,
// or with MetricsSecure over TLS behind the API server's authentication
// and authorization. A nil listener: metrics are off.
func (c Config) metricsEndpoint(reg *prometheus.Registry) (net.Listener, http.Handler, error) {
	l, err := metrics.Listen(c.MetricsAddr)
	if err != nil {
		return nil, nil, fmt.Errorf("metrics: %w", err)
	}
	h := metrics.Handler(reg)
	if l == nil {
		return nil, h, nil
	}
	if !c.MetricsSecure {
		return l, h, nil
	}
	if h, err = metrics.SecureHandler(c.Rest, c.Log.WithName("metrics"), h); err != nil {
		closeAll(l)
		return nil, nil, err
	}
	tl, err := metrics.TLSListener(l)
	if err != nil {
		closeAll(l)
		return nil, nil, err
	}
	return tl, h, nil
}
