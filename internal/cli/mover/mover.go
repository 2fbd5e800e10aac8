// Package mover is the `berth mover` command: copies the node's holder
// interfaces into the host network namespace (privileged, host network,
// host PID).
package mover

import (
	"context"
	"flag"
	"log/slog"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/network"
)

// Command is `berth mover`.
func Command() cli.Command {
	return cli.Command{
		Name:    "mover",
		Summary: "copy holder interfaces into the host network namespace (multus)",
		Main:    cli.ParseThenRun(Parse),
	}
}

// Config is the mover's flags.
type Config struct {
	// Dir is the holders' folder (hostPath).
	Dir string
	// Proc is a proc filesystem of the host's PID namespace.
	Proc     string
	Interval time.Duration
	Log      logr.Logger
}

// Run copies until ctx ends (SIGTERM), then removes every copy and gives
// the holders their interfaces back. It works in the namespace of the
// thread that calls it: the host's.
func (c Config) Run(ctx context.Context) error {
	host, err := network.OpenOwnStack()
	if err != nil {
		return err
	}
	defer host.Close()
	m := network.NewMover(host, network.ProcNamespaces{Proc: c.Proc}, network.Dir(c.Dir), c.Log)
	m.Interval = c.Interval
	return m.Run(ctx)
}

// Parse turns the command's arguments into a Config.
func Parse(args []string, stdio cli.IO) (Config, error) {
	fs := flag.NewFlagSet("berth mover", flag.ContinueOnError)
	fs.SetOutput(stdio.Stderr)
	cfg := Config{Log: logr.FromSlogHandler(slog.NewTextHandler(stdio.Stderr, nil))}
	fs.StringVar(&cfg.Dir, "dir", network.DefaultDir, "the holders' folder (hostPath)")
	fs.StringVar(&cfg.Proc, "proc", "/proc", "proc of the host's PID namespace")
	fs.DurationVar(&cfg.Interval, "interval", 5*time.Second, "time between rounds (and retries)")
	err := fs.Parse(args)
	return cfg, err
}
