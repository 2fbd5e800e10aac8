// Package keeper is the `berth keeper` command: holds the volumes' FUSE
// connections across blockdev server restarts.
package keeper

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/keeper"
)

// Config is the keeper's flags.
type Config struct {
	Socket string
	// Ping asks the running keeper at Socket whether it answers, and exits:
	// the keeper pod's readiness probe.
	Ping bool
	Log  logr.Logger
}

// pingTimeout bounds a probe's ping; a keeper busy with a hung mount still
// answers a ping from another connection at once.
const pingTimeout = 3 * time.Second

func (c Config) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := keeper.NewClient(c.Socket).Ping(ctx); err != nil {
		return fmt.Errorf("keeper at %s: %w", c.Socket, err)
	}
	return nil
}

// Run serves until ctx ends. Exiting drops every held connection: the
// mounts then fail all I/O once their servers are gone too.
func (c Config) Run(ctx context.Context) error {
	if c.Ping {
		return c.ping(ctx)
	}
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
	return cli.FlagCommand("keeper", "hold userspace volumes' FUSE connections across server restarts", func(fs *flag.FlagSet, stdio cli.IO) func(context.Context) error {
		cfg := Config{Log: logr.FromSlogHandler(slog.NewTextHandler(stdio.Stderr, nil))}
		fs.StringVar(&cfg.Socket, "socket", "/run/berth/keeper.sock", "root-only Unix socket")
		fs.BoolVar(&cfg.Ping, "ping", false, "ask the keeper serving --socket whether it answers, then exit (readiness probe)")
		return func(ctx context.Context) error { return cfg.Run(ctx) }
	})
}
