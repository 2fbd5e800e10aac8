// Package preflight is the `berth preflight` command: before an upgrade
// or a rollback, it says whether berth is quiet enough (internal/preflight)
// and fails, naming what to wait for, when it is not.
package preflight

import (
	"context"
	"flag"
	"fmt"
	"io"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/cli/kube"
	"github.com/berth-io/berth/internal/preflight"
)

// Config is the command's flags and what it reads and writes through.
type Config struct {
	// Namespace is berth's (where ShareManagers live).
	Namespace string
	// Reader reads from the API server.
	Reader client.Reader
	Out    io.Writer
}

// ErrNotReady says something must settle before an upgrade.
var ErrNotReady = fmt.Errorf("not ready to upgrade")

// Run prints the findings, or the all-clear line.
func (c Config) Run(ctx context.Context) error {
	r, err := preflight.Check(ctx, c.Reader, c.Namespace)
	if err != nil {
		return err
	}
	if r.OK() {
		_, err := fmt.Fprintf(c.Out, "ready to upgrade: %d storage clusters ready, %d volumes and %d shares settled, no node lost, no lock break or cleanup under way\n",
			r.StorageClusters, r.Volumes, r.Shares)
		return err
	}
	for _, f := range r.Findings {
		if _, err := fmt.Fprintln(c.Out, f); err != nil {
			return err
		}
	}
	return fmt.Errorf("%w: %d things to settle first (listed above)", ErrNotReady, len(r.Findings))
}

// Command is `berth preflight`.
func Command() cli.Command {
	return cli.FlagCommand("preflight", "check that berth may be upgraded or rolled back now (every volume settled, no share failing over)",
		func(fs *flag.FlagSet, stdio cli.IO) func(context.Context) error {
			cfg := Config{Out: stdio.Stdout}
			var kf kube.Flags
			kf.Register(fs)
			fs.StringVar(&cfg.Namespace, "namespace", "berth-system", "berth's namespace (where its ShareManagers live)")
			return func(ctx context.Context) error {
				c, err := kf.Client()
				if err != nil {
					return err
				}
				cfg.Reader = c
				return cfg.Run(ctx)
			}
		})
}
