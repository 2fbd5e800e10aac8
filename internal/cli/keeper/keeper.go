// Package keeper is the `berth keeper` command: holds the volumes' FUSE
// connections across blockdev server restarts.
package keeper

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/keeper"
	"github.com/berth-io/berth/internal/metrics"
)

// Config is the keeper's flags.
type Config struct {
	Socket string
	// Ping asks the running keeper at Socket whether it answers, and exits:
	// the keeper pod's readiness probe.
	Ping bool
	// HealthAddr, when set, serves /readyz (this process serves Socket:
	// the keeper pod's readiness probe over HTTP, which execs nothing) and
	// /healthz there.
	HealthAddr string
	// HandOverWait is how long a stopped keeper holding connections serves
	// on for a new keeper to take them over.
	HandOverWait time.Duration
	Log          logr.Logger
}

// pingTimeout bounds a probe's ping; a keeper busy with a hung mount still
// answers a ping from another connection at once.
const pingTimeout = 3 * time.Second

// ping succeeds only when the keeper answering is this container's: while
// a new keeper's pod starts beside the old one, the old one answers, and
// the new pod must not be ready (the rollout then deletes the old pod)
// before it has taken over. Processes of one container share its mount
// namespace; those of two containers never do.
func (c Config) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	pid, err := keeper.NewClient(c.Socket).Serving(ctx)
	if err != nil {
		return fmt.Errorf("keeper at %s: %w", c.Socket, err)
	}
	mine, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return fmt.Errorf("own mount namespace: %w", err)
	}
	theirs, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if pid <= 0 || err != nil || theirs != mine {
		return fmt.Errorf("keeper at %s answers from pid %d, not from this container: it has not taken over (yet) (%v)", c.Socket, pid, err)
	}
	return nil
}

// serving is nil when the keeper answering at Socket is this process
// (readiness served in process: a new keeper is ready once it has taken
// over, the old one is not after it handed over).
func (c Config) serving(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	pid, err := keeper.NewClient(c.Socket).Serving(ctx)
	if err != nil {
		return fmt.Errorf("keeper at %s: %w", c.Socket, err)
	}
	if int(pid) != os.Getpid() {
		return fmt.Errorf("keeper at %s answers from pid %d, not this one (%d): it has not taken over (yet), or handed over", c.Socket, pid, os.Getpid())
	}
	return nil
}

// Run serves until ctx ends, taking over from the keeper already serving
// the socket if there is one. Once a new keeper took over, it holds
// nothing and waits for ctx: a container that exits is started again, and
// would take the connections back. Exiting without a hand-over drops every
// held connection: the mounts then fail all I/O once their servers are
// gone too.
func (c Config) Run(ctx context.Context) error {
	if c.Ping {
		return c.ping(ctx)
	}
	health, err := metrics.Listen(c.HealthAddr)
	if err != nil {
		return err
	}
	if health != nil {
		probes := metrics.ProbeHandler(func() error { return nil }, func() error { return c.serving(ctx) })
		go func() {
			if err := metrics.Serve(ctx, health, probes); err != nil {
				c.Log.Error(err, "health endpoint", "addr", c.HealthAddr)
			}
		}()
	}
	svc := keeper.New(keeper.HostKernel{}, c.Log)
	svc.HandOverWait = c.HandOverWait
	l, err := svc.Start(ctx, c.Socket)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	c.Log.Info("keeper listening", "socket", c.Socket, "volumes", len(svc.Held()))
	err = svc.Serve(ctx, l)
	if n, ok := svc.HandedOver(); ok {
		c.Log.Info("keeper handed over: holding nothing, waiting to be stopped", "volumes", n)
		<-ctx.Done()
		return err
	}
	if held := svc.Held(); len(held) > 0 {
		c.Log.Error(nil, "keeper exiting without a hand-over, the keeper's failure case: its connections end, and their mounts fail all I/O once their servers are gone", "volumes", held)
	}
	return err
}

// Command is `berth keeper`.
func Command() cli.Command {
	return cli.FlagCommand("keeper", "hold userspace volumes' FUSE connections across server restarts", func(fs *flag.FlagSet, stdio cli.IO) func(context.Context) error {
		cfg := Config{Log: logr.FromSlogHandler(slog.NewTextHandler(stdio.Stderr, nil))}
		fs.StringVar(&cfg.Socket, "socket", "/run/berth/keeper.sock", "root-only Unix socket")
		fs.StringVar(&cfg.HealthAddr, "health-addr", "", "serve /readyz (this keeper serves --socket) and /healthz here; empty: none")
		fs.BoolVar(&cfg.Ping, "ping", false, "ask the keeper serving --socket whether it answers and is this container's, then exit (readiness probe)")
		fs.DurationVar(&cfg.HandOverWait, "hand-over-wait", 25*time.Second,
			"once stopped while holding connections, serve on this long for a new keeper to take them over (within the pod's 30s grace)")
		return func(ctx context.Context) error { return cfg.Run(ctx) }
	})
}
