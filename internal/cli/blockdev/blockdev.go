// Package blockdev is the `berth blockdev` command: one userspace block device
// server, taking its FUSE connection from the keeper.
package blockdev

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/go-logr/logr"

	"github.com/berth-io/berth/internal/blockdev"
	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/keeper"
)

// Config is the server's flags.
type Config struct {
	KeeperSocket string
	Volume       string
	Image        string
	Mountpoint   string
	Workers      int
	Direct       bool
	Passthrough  bool
	// ReadyFD, if > 0, gets "ready\n" once the server answers, then closed.
	ReadyFD int
	Log     logr.Logger
}

// Run serves until ctx ends or the volume is closed in the keeper.
func (c Config) Run(ctx context.Context) error {
	if c.KeeperSocket == "" || c.Volume == "" || c.Image == "" || c.Mountpoint == "" {
		return errors.New("--keeper-socket, --volume, --image and --mountpoint are required")
	}
	var ready io.WriteCloser
	if c.ReadyFD > 0 {
		ready = os.NewFile(uintptr(c.ReadyFD), "ready")
		defer func() { _ = ready.Close() }()
	}
	return blockdev.Run(ctx, blockdev.RunConfig{
		Keeper:      keeper.NewClient(c.KeeperSocket),
		Volume:      c.Volume,
		Mountpoint:  c.Mountpoint,
		Image:       c.Image,
		Direct:      c.Direct,
		Passthrough: c.Passthrough,
		Workers:     c.Workers,
		Log:         c.Log,
		OnReady: func() {
			if ready != nil {
				_, _ = fmt.Fprintln(ready, "ready")
				_ = ready.Close()
			}
		},
	})
}

// Command is `berth blockdev`.
func Command() cli.Command {
	return cli.Command{
		Name:    "blockdev",
		Summary: "serve a volume image as a block device (FUSE file for a loop device)",
		Main: func(ctx context.Context, args []string, stdio cli.IO) error {
			fs := flag.NewFlagSet("berth blockdev", flag.ContinueOnError)
			fs.SetOutput(stdio.Stderr)
			cfg := Config{Log: logr.FromSlogHandler(slog.NewTextHandler(stdio.Stderr, nil))}
			fs.StringVar(&cfg.KeeperSocket, "keeper-socket", "/run/berth/keeper.sock", "the keeper's socket")
			fs.StringVar(&cfg.Volume, "volume", "", "volume id (the keeper's key)")
			fs.StringVar(&cfg.Image, "image", "", "backing image file")
			fs.StringVar(&cfg.Mountpoint, "mountpoint", "", "where the keeper mounts the FUSE file system (holds disk.img)")
			fs.IntVar(&cfg.Workers, "workers", 0, "request reader goroutines (0: default)")
			fs.BoolVar(&cfg.Direct, "direct", true, "O_DIRECT for aligned I/O on the image")
			fs.BoolVar(&cfg.Passthrough, "passthrough", false, "let the kernel read and write the image itself (FUSE passthrough, 6.9+)")
			fs.IntVar(&cfg.ReadyFD, "ready-fd", 0, "fd to write \"ready\" to once serving")
			if err := fs.Parse(args); err != nil {
				return err
			}
			return cfg.Run(ctx)
		},
	}
}
