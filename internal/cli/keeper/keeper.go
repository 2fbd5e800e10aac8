// Package keeper is the `berth keeper` command: holds the volumes' FUSE
// connections across blockdev server restarts.
package keeper

import (
	"context"
	"flag"
	"log/slog"

	"github.com/go-logr/logr"

	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/keeper"
)

// Config is the keeper's flags.
type Config struct {
	Socket string
	Log    logr.Logger
}

// Run serves until ctx ends. Exiting drops every held connection: the
// mounts then fail all I/O once their servers are gone too.
func (c Config) Run(ctx context.Context) error {
	l, err := keeper.Listen(c.Socket)
	if err != nil {
		return err
	}
	svc := keeper.New(keeper.HostKernel{}, c.Log)
	c.Log.Info("keeper listening", "socket", c.Socket)
	err = svc.Serve(ctx, l)
	if held := svc.Held(); len(held) > 0 {
		c.Log.Info("keeper exiting with connections held: their mounts die with their servers", "volumes", held)
	}
	return err
}

// Command is `berth keeper`.
func Command() cli.Command {
	return cli.Command{
		Name:    "keeper",
		Summary: "hold userspace volumes' FUSE connections across server restarts",
		Main: func(ctx context.Context, args []string, stdio cli.IO) error {
			fs := flag.NewFlagSet("berth keeper", flag.ContinueOnError)
			fs.SetOutput(stdio.Stderr)
			cfg := Config{Log: logr.FromSlogHandler(slog.NewTextHandler(stdio.Stderr, nil))}
			fs.StringVar(&cfg.Socket, "socket", "/run/berth/keeper.sock", "root-only Unix socket")
			if err := fs.Parse(args); err != nil {
				return err
			}
			return cfg.Run(ctx)
		},
	}
}
