// Package csicontroller is the `berth csi-controller` command: the CSI
// Identity and Controller services, run beside the standard CSI sidecars.
package csicontroller

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
	// MetricsAddr serves /metrics, HealthAddr /healthz and /readyz; "0"
	// turns either off.
	MetricsAddr string
	HealthAddr  string
	Rest        *rest.Config
	Log         logr.Logger
}

// The controller's endpoints: ports apart from the agent's, so that both
// may share a host network.
const (
	DefaultMetricsAddr = ":9743"
	DefaultHealthAddr  = ":9744"
)

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
	// No manager here: a registry of its own, served by promhttp.
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
	ml, err := metrics.Listen(c.MetricsAddr)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
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
		"metrics", c.MetricsAddr, "health", c.HealthAddr)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := func() error { return dialable(l.Addr()) }
	pools := &csi.PoolCapacityPublisher{
		Client: kc, Namespace: c.Namespace, Free: ctrl.PoolFree,
		Schedule: capacity.Schedule{Classes: classes, Interval: c.CapacityInterval}, Log: c.Log.WithName("pool-capacity"),
	}
	runs := []func() error{
		func() error { return csi.Serve(ctx, srv, l) },
		func() error { return pools.Start(ctx) },
		func() error { return metrics.Serve(ctx, ml, metrics.Handler(reg)) },
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
		fs.StringVar(&cfg.MetricsAddr, "metrics-addr", DefaultMetricsAddr, "Prometheus /metrics listen address; 0 disables")
		fs.StringVar(&cfg.HealthAddr, "health-addr", DefaultHealthAddr, "/healthz and /readyz listen address; 0 disables")
		return func(ctx context.Context, log logr.Logger, rest *rest.Config) error {
			cfg.Log, cfg.Rest = log, rest
			return cfg.Run(ctx)
		}
	})
}
