// Package csicontroller is the `berth csi-controller` command: the CSI
// Identity and Controller services, run beside the standard CSI sidecars.
package csicontroller

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/csi"
	"github.com/berth-io/berth/internal/scheme"
	"github.com/berth-io/berth/internal/version"
)

// Config of the CSI controller.
type Config struct {
	Endpoint       string
	StorageCluster string
	Namespace      string
	Wait           time.Duration
	Rest           *rest.Config
	Log            logr.Logger
}

// Run serves until ctx ends.
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
	l, err := csi.Listen(c.Endpoint)
	if err != nil {
		return err
	}
	srv := csi.NewServer(c.Log, csi.Services{
		Identity:   csi.NewIdentity(v1.DriverName, version.Get().Version, true, nil),
		Controller: csi.NewController(kc, csi.ControllerConfig{StorageCluster: c.StorageCluster, Namespace: c.Namespace, Wait: c.Wait}, c.Log.WithName("controller")),
	})
	c.Log.Info("serving CSI controller", "endpoint", c.Endpoint, "storageCluster", c.StorageCluster)
	return csi.Serve(ctx, srv, l)
}

// Command is `berth csi-controller`.
func Command() cli.Command {
	return cli.Command{
		Name:    "csi-controller",
		Summary: "serve the CSI Identity and Controller services",
		Main: func(ctx context.Context, args []string, stdio cli.IO) error {
			fs := flag.NewFlagSet("berth csi-controller", flag.ContinueOnError)
			fs.SetOutput(stdio.Stderr)
			var (
				cfg        Config
				kubeconfig string
				verbosity  int
			)
			fs.StringVar(&cfg.Endpoint, "endpoint", "unix:///csi/csi.sock", "CSI endpoint (unix socket)")
			fs.StringVar(&cfg.StorageCluster, "storage-cluster", "berth", "StorageCluster new volumes belong to")
			ns := os.Getenv("POD_NAMESPACE")
			if ns == "" {
				ns = "berth-system"
			}
			fs.StringVar(&cfg.Namespace, "namespace", ns, "berth's namespace, where agents publish CSIStorageCapacity objects (default $POD_NAMESPACE or berth-system)")
			fs.DurationVar(&cfg.Wait, "agent-wait", 2*time.Minute, "how long a call waits for the node agent")
			fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG or in-cluster)")
			fs.IntVar(&verbosity, "v", 0, "log verbosity")
			if err := fs.Parse(args); err != nil {
				return err
			}
			cfg.Log = cli.NewLogger(stdio.Stderr, verbosity, "csi-controller")
			var err error
			if cfg.Rest, err = cli.RestConfig(kubeconfig); err != nil {
				return err
			}
			return cfg.Run(ctx)
		},
	}
}
