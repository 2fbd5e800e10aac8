// Package blockdev is the `berth blockdev` command: one userspace block device
// server, either a FUSE file for a loop device (taking its FUSE connection from
// the keeper), the kernel's nbd driver or the kernel's ublk driver.
package blockdev

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-io/berth/internal/blockdev"
	"github.com/berth-io/berth/internal/blockdev/backing"
	"github.com/berth-io/berth/internal/blockdev/launch"
	"github.com/berth-io/berth/internal/blockdev/ublk"
	"github.com/berth-io/berth/internal/cli"
	"github.com/berth-io/berth/internal/keeper"
	"github.com/berth-io/berth/internal/nbd"
)

// Config is the server's flags.
type Config struct {
	// Transport is launch.TransportFUSE ("" too), launch.TransportNBD or
	// launch.TransportUblk.
	Transport    string
	KeeperSocket string
	// Node names this node in the nbd device's identifier and the ublk
	// device's tag.
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
	// UblkRecover (ublk), when set, is the device whose server died: this
	// server takes it over. Nil adds a new device.
	UblkRecover *uint32
	// Dev is where the ublk device nodes are ("": /dev).
	Dev string
	// ReadyFD, if > 0, gets "ready\n" (fuse) or "ready <device>\n" (nbd, ublk)
	// once the server answers, then closed.
	ReadyFD int
	// HoldFD (fuse), if > 0, holds the volume's I/O after a takeover until
	// its other end is closed, or MaxHold has passed (launch.HoldGroup).
	HoldFD int
	// MaxHold bounds the hold (0: DefaultMaxHold).
	MaxHold time.Duration
	// IOErrorsFile, when set, counts the requests the image failed, kept
	// across the volume's servers (blockdev.IOErrors).
	IOErrorsFile string
	// Kernel drives nbd (nil: netlink).
	Kernel nbd.Kernel
	Log    logr.Logger
}

// flagTransports names the transports a flag belongs to (none: all);
// given with another transport, it is refused rather than silently
// ignored.
func flagTransports(name string) []string {
	switch name {
	case "keeper-socket", "mountpoint", "passthrough", "hold-fd", "max-hold":
		return []string{launch.TransportFUSE}
	case "dead-conn-timeout", "connections":
		return []string{launch.TransportNBD}
	case "node":
		return []string{launch.TransportNBD, launch.TransportUblk}
	case "ublk-recover":
		return []string{launch.TransportUblk}
	}
	return nil
}

// checkFlags refuses an unknown transport and flags of the other transport.
func checkFlags(transport string, set map[string]bool) error {
	switch transport {
	case launch.TransportFUSE, launch.TransportNBD, launch.TransportUblk:
	default:
		return fmt.Errorf("--transport %q: want %s, %s or %s", transport, launch.TransportFUSE, launch.TransportNBD, launch.TransportUblk)
	}
	var wrong []string
	for name := range set {
		if ts := flagTransports(name); ts != nil && !slices.Contains(ts, transport) {
			wrong = append(wrong, "--"+name)
		}
	}
	if len(wrong) > 0 {
		sort.Strings(wrong)
		return fmt.Errorf("%s not used with --transport %s", strings.Join(wrong, ", "), transport)
	}
	return nil
}

// Run serves until ctx ends, the volume is closed in the keeper (fuse), or
// the device is disconnected (nbd) or stopped (ublk).
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

// ioErrorsEvery is how often the I/O error count is written while it
// changes.
const ioErrorsEvery = time.Second

// serve runs the server of c's transport, counting the requests its image
// fails in IOErrorsFile; say tells the agent it is ready.
func (c Config) serve(ctx context.Context, say func(string)) error {
	var ioErrs *blockdev.IOErrors
	if c.IOErrorsFile != "" {
		var err error
		if ioErrs, err = blockdev.OpenIOErrors(c.IOErrorsFile); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	written := make(chan struct{})
	go func() {
		defer close(written)
		// A count that cannot be written is no reason to stop serving.
		if err := ioErrs.Run(ctx, ioErrorsEvery); err != nil {
			c.Log.Error(err, "I/O error count no longer written", "file", c.IOErrorsFile)
		}
	}()
	defer func() { cancel(); <-written }()
	switch c.Transport {
	case launch.TransportNBD:
		return c.runNBD(ctx, say, ioErrs)
	case launch.TransportUblk:
		return c.runUblk(ctx, say, ioErrs)
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
		IOErrors:    ioErrs,
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

func (c Config) runNBD(ctx context.Context, say func(string), ioErrs *blockdev.IOErrors) error {
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
		OnIOError:       ioErrs.Add,
	})
}

// runUblk serves the image on a ublk device: a new one, or the one
// UblkRecover names, whose server died (the kernel kept it and queued its
// I/O). When ctx ends the server goes as its death would: the kernel keeps
// the device for the next server. Whoever unstages the volume stops and
// deletes the device.
func (c Config) runUblk(ctx context.Context, say func(string), ioErrs *blockdev.IOErrors) error {
	ctl, err := ublk.OpenControl(ublk.ControlConfig{Dev: c.Dev})
	if err != nil {
		return fmt.Errorf("--transport ublk: %w", err)
	}
	defer func() { _ = ctl.Close() }()
	img, err := backing.Open(c.Image, c.Direct)
	if err != nil {
		return err
	}
	defer func() { _ = img.Close() }()
	log := c.Log.WithValues("volume", c.Volume)
	recovering := c.UblkRecover != nil
	if t, ok := img.(backing.TakerOver); ok && recovering {
		// The device's previous server is gone: its hold on the image
		// must not make the first write wait.
		if err := t.TakeOver(); err != nil {
			log.Error(err, "previous server's hold on the image not freed; the first write waits until it lapses")
		}
	}
	if l, ok := img.(backing.Locker); ok {
		if err := l.Lock(); err != nil {
			return err
		}
	}
	// A ublk device has whole 4 KiB blocks; berth's images are whole MiBs
	// but for a size limit that is not.
	size := img.Size() &^ 4095
	if size != img.Size() {
		log.Info("image size is not whole 4 KiB blocks: the device ends at the last whole one", "image", img.Size(), "device", size)
	}
	cfg := ublk.ServerConfig{Dev: c.Dev, Backend: img, Size: size, OnIOError: ioErrs.Add, Tag: ublk.Tag(c.Node, c.Volume)}
	var s *ublk.Server
	if recovering {
		s, err = ublk.Recover(ctx, ctl, *c.UblkRecover, cfg)
	} else {
		s, err = ublk.Serve(ctx, ctl, cfg)
	}
	if err != nil {
		return err
	}
	dev := ublk.BlockPath(c.Dev, s.ID)
	log.Info("serving", "device", dev, "image", c.Image, "recovered", recovering, "direct", img.Direct())
	say("ready " + dev)
	err = <-s.Done()
	switch {
	case err == nil:
		log.Info("device stopped", "device", dev)
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return nil
	}
	return err
}

// Command is `berth blockdev`.
func Command() cli.Command {
	return cli.FlagCommand("blockdev", "serve a volume image as a block device (FUSE file for a loop device, nbd or ublk)", func(fs *flag.FlagSet, stdio cli.IO) func(context.Context) error {
		cfg := Config{Log: logr.FromSlogHandler(slog.NewTextHandler(stdio.Stderr, nil))}
		fs.StringVar(&cfg.Transport, "transport", launch.TransportFUSE, "fuse (FUSE file + loop, via the keeper), nbd (the kernel's nbd driver) or ublk (the kernel's ublk driver)")
		fs.StringVar(&cfg.KeeperSocket, "keeper-socket", "/run/berth/keeper.sock", "the keeper's socket (fuse)")
		fs.StringVar(&cfg.Volume, "volume", "", "volume id (the keeper's key; the nbd backend identifier)")
		fs.StringVar(&cfg.Image, "image", "", "backing image file")
		fs.StringVar(&cfg.Node, "node", "", "this node's name, part of the nbd device's identifier and the ublk device's tag, so that nodes sharing a kernel never take each other's device (nbd, ublk)")
		fs.StringVar(&cfg.Mountpoint, "mountpoint", "", "where the keeper mounts the FUSE file system (holds disk.img) (fuse)")
		fs.IntVar(&cfg.Workers, "workers", 0, "request goroutines, per connection for nbd (0: default)")
		fs.BoolVar(&cfg.Direct, "direct", true, "O_DIRECT for aligned I/O on the image")
		fs.BoolVar(&cfg.Passthrough, "passthrough", false, "let the kernel read and write the image itself (FUSE passthrough, 6.9+) (fuse)")
		fs.DurationVar(&cfg.DeadConnTimeout, "dead-conn-timeout", nbd.DefaultDeadConnTimeout, "how long the kernel queues I/O while no server is connected, before failing it until one reconnects (nbd)")
		fs.IntVar(&cfg.Connections, "connections", nbd.DefaultConnections, "sockets of a new nbd device (nbd)")
		fs.Func("ublk-recover", "take over this ublk device, whose server died, instead of adding a new one (ublk)", func(v string) error {
			id, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return fmt.Errorf("want a ublk device number: %w", err)
			}
			dev := uint32(id)
			cfg.UblkRecover = &dev
			return nil
		})
		fs.StringVar(&cfg.IOErrorsFile, "io-errors-file", "", "file that counts the requests the image failed, kept across the volume's servers (the agent sums its node's)")
		fs.IntVar(&cfg.ReadyFD, "ready-fd", 0, "fd to write \"ready\" (fuse) or \"ready <device>\" (nbd, ublk) to once serving")
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
