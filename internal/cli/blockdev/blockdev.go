// Package blockdev is the `berth blockdev` command: one userspace block device
// server, either a FUSE file for a loop device (taking its FUSE connection from
// the keeper) or the kernel's nbd driver.
package blockdev

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-io/berth/internal/blockdev"
	"github.com/berth-io/berth/internal/blockdev/launch"
	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/keeper"
	"github.com/berth-io/berth/internal/nbd"
)

// Config is the server's flags.
type Config struct {
	// Transport is launch.TransportFUSE ("" too) or launch.TransportNBD.
	Transport    string
	KeeperSocket string
	// Node names this node in the nbd device's identifier.
	Node        string
	Volume      string
	Image       string
	Mountpoint  string
	Workers     int
	Direct      bool
	Passthrough bool
	// DeadConnTimeout and Connections configure the nbd device.
	DeadConnTimeout time.Duration
	Connections     int
	// Sysfs is where nbd devices and the module are looked up ("": /sys).
	Sysfs string
	// ReadyFD, if > 0, gets "ready\n" (fuse) or "ready <device>\n" (nbd)
	// once the server answers, then closed.
	ReadyFD int
	// HoldFD (fuse), if > 0, holds the volume's I/O after a takeover until
	// its other end is closed, or MaxHold has passed (launch.HoldGroup).
	HoldFD int
	// MaxHold bounds the hold (0: DefaultMaxHold).
	MaxHold time.Duration
	// Kernel drives nbd (nil: netlink).
	Kernel nbd.Kernel
	Log    logr.Logger
}

// flagTransport names the transport a flag belongs to ("" : both); given
// with the other transport, it is refused rather than silently ignored.
func flagTransport(name string) string {
	switch name {
	case "keeper-socket", "mountpoint", "passthrough", "hold-fd", "max-hold":
		return launch.TransportFUSE
	case "dead-conn-timeout", "connections", "node":
		return launch.TransportNBD
	}
	return ""
}

// checkFlags refuses an unknown transport and flags of the other transport.
func checkFlags(transport string, set map[string]bool) error {
	switch transport {
	case launch.TransportFUSE, launch.TransportNBD:
	default:
		return fmt.Errorf("--transport %q: want %s or %s", transport, launch.TransportFUSE, launch.TransportNBD)
	}
	var wrong []string
	for name := range set {
		if t := flagTransport(name); t != "" && t != transport {
			wrong = append(wrong, "--"+name)
		}
	}
	if len(wrong) > 0 {
		sort.Strings(wrong)
		return fmt.Errorf("%s not used with --transport %s", strings.Join(wrong, ", "), transport)
	}
	return nil
}

// Run serves until ctx ends, the volume is closed in the keeper (fuse) or
// the device is disconnected (nbd).
func (c Config) Run(ctx context.Context) error {
	if c.Transport == "" {
		c.Transport = launch.TransportFUSE
	}
	if err := checkFlags(c.Transport, nil); err != nil {
		return err
	}
	if c.Volume == "" || c.Image == "" {
		return errors.New("--volume and --image are required")
	}
	var ready io.WriteCloser
	if c.ReadyFD > 0 {
		ready = os.NewFile(uintptr(c.ReadyFD), "ready")
		defer func() { _ = ready.Close() }()
	}
	var once sync.Once
	say := func(line string) {
		once.Do(func() {
			if ready != nil {
				_, _ = fmt.Fprintln(ready, line)
				_ = ready.Close()
			}
		})
	}
	err := c.serve(ctx, say)
	if err != nil {
		// The agent waiting for "ready" gets the reason, not only an exit
		// status (a refused Ceph key, say).
		say(launch.ErrorLine(err))
	}
	return err
}

// serve runs the server of c's transport; say tells the agent it is ready.
func (c Config) serve(ctx context.Context, say func(string)) error {
	if c.Transport == launch.TransportNBD {
		return c.runNBD(ctx, say)
	}
	if c.KeeperSocket == "" || c.Mountpoint == "" {
		return errors.New("--keeper-socket and --mountpoint are required with --transport fuse")
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
		OnReady:     func() { say("ready") },
		Hold:        c.hold(),
	})
}

// DefaultMaxHold bounds how long a healed volume's I/O waits for the other
// servers of its heal pass: about the time 100 servers take to start on 2
// busy cores, so that a larger pass, or a start that hangs, costs a volume
// at most that much more.
const DefaultMaxHold = time.Second

// hold is the RunConfig.Hold of HoldFD, or nil.
func (c Config) hold() func(context.Context) {
	if c.HoldFD <= 0 {
		return nil
	}
	max := c.MaxHold
	if max <= 0 {
		max = DefaultMaxHold
	}
	return blockdev.HoldFor(os.NewFile(uintptr(c.HoldFD), "hold"), max)
}

func (c Config) runNBD(ctx context.Context, say func(string)) error {
	sysfs := c.Sysfs
	if sysfs == "" {
		sysfs = "/sys"
	}
	if ok, reason := nbd.Available(sysfs); !ok {
		return fmt.Errorf("--transport nbd: %s", reason)
	}
	k := c.Kernel
	if k == nil {
		k = nbd.NewNetlink()
	}
	return nbd.Run(ctx, nbd.RunConfig{
		Kernel:          k,
		Sysfs:           sysfs,
		Node:            c.Node,
		Volume:          c.Volume,
		Image:           c.Image,
		Direct:          c.Direct,
		Connections:     c.Connections,
		Workers:         c.Workers,
		DeadConnTimeout: c.DeadConnTimeout,
		Log:             c.Log,
		OnReady:         func(dev string) { say("ready " + dev) },
	})
}

// Command is `berth blockdev`.
func Command() cli.Command {
	return cli.FlagCommand("blockdev", "serve a volume image as a block device (FUSE file for a loop device, or nbd)", func(fs *flag.FlagSet, stdio cli.IO) func(context.Context) error {
		cfg := Config{Log: logr.FromSlogHandler(slog.NewTextHandler(stdio.Stderr, nil))}
		fs.StringVar(&cfg.Transport, "transport", launch.TransportFUSE, "fuse (FUSE file + loop, via the keeper) or nbd (the kernel's nbd driver)")
		fs.StringVar(&cfg.KeeperSocket, "keeper-socket", "/run/berth/keeper.sock", "the keeper's socket (fuse)")
		fs.StringVar(&cfg.Volume, "volume", "", "volume id (the keeper's key; the nbd backend identifier)")
		fs.StringVar(&cfg.Image, "image", "", "backing image file")
		fs.StringVar(&cfg.Node, "node", "", "this node's name, part of the nbd device's identifier so that nodes sharing a kernel never take each other's device (nbd)")
		fs.StringVar(&cfg.Mountpoint, "mountpoint", "", "where the keeper mounts the FUSE file system (holds disk.img) (fuse)")
		fs.IntVar(&cfg.Workers, "workers", 0, "request goroutines, per connection for nbd (0: default)")
		fs.BoolVar(&cfg.Direct, "direct", true, "O_DIRECT for aligned I/O on the image")
		fs.BoolVar(&cfg.Passthrough, "passthrough", false, "let the kernel read and write the image itself (FUSE passthrough, 6.9+) (fuse)")
		fs.DurationVar(&cfg.DeadConnTimeout, "dead-conn-timeout", nbd.DefaultDeadConnTimeout, "how long the kernel queues I/O while no server is connected, before failing it until one reconnects (nbd)")
		fs.IntVar(&cfg.Connections, "connections", nbd.DefaultConnections, "sockets of a new nbd device (nbd)")
		fs.IntVar(&cfg.ReadyFD, "ready-fd", 0, "fd to write \"ready\" (fuse) or \"ready <device>\" (nbd) to once serving")
		fs.IntVar(&cfg.HoldFD, "hold-fd", 0, "fd whose close (by the agent) lets the volume's I/O resume after a takeover (fuse)")
		fs.DurationVar(&cfg.MaxHold, "max-hold", DefaultMaxHold, "the longest --hold-fd holds the volume's I/O (fuse)")
		return func(ctx context.Context) error {
			set := map[string]bool{}
			fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
			if err := checkFlags(cfg.Transport, set); err != nil {
				return err
			}
			return cfg.Run(ctx)
		}
	})
}
