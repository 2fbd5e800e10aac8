package nbd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-io/berth/internal/blockdev/backing"
)

// RunConfig is one server process's work.
type RunConfig struct {
	Kernel Kernel
	// Sysfs is where FindByBackend looks ("" means /sys).
	Sysfs string
	// Node is the node the device belongs to (part of its identifier, see
	// BackendID; "" for the single-node form).
	Node   string
	Volume string
	Image  string
	// Direct opens the image with O_DIRECT for aligned I/O.
	Direct bool
	// Connections is the number of sockets of a new device (0: 2).
	Connections int
	// Workers bounds the concurrent requests per connection (0: DefaultWorkers).
	Workers int
	// DeadConnTimeout is how long I/O waits for a new server before it
	// fails (0: 120s); the device stays until disconnected.
	DeadConnTimeout time.Duration
	// ReconnectWait bounds how long Run retries handing its sockets to an
	// existing device whose old connections the kernel has not yet seen die
	// (0: 15s).
	ReconnectWait time.Duration
	// OnReady gets the device path once it is served.
	OnReady func(device string)
	// OnIOError is called for each request the image failed (nil: none).
	OnIOError func()
	Log       logr.Logger
}

const (
	// DefaultConnections is the number of sockets of a new device.
	DefaultConnections = 2
	// DefaultDeadConnTimeout is how long the kernel queues I/O while no
	// server is connected, by default.
	DefaultDeadConnTimeout = 120 * time.Second
	maxConnections         = 16
	defaultReconnectWait   = 15 * time.Second
	retryEvery             = 200 * time.Millisecond
)

func (c *RunConfig) defaults() error {
	if c.Kernel == nil || c.Volume == "" || c.Image == "" {
		return errors.New("nbd: Run needs a kernel, a volume and an image")
	}
	if c.Sysfs == "" {
		c.Sysfs = "/sys"
	}
	if c.Connections == 0 {
		c.Connections = DefaultConnections
	}
	if c.Connections < 1 || c.Connections > maxConnections {
		return fmt.Errorf("nbd: %d connections: want 1..%d", c.Connections, maxConnections)
	}
	if c.DeadConnTimeout == 0 {
		c.DeadConnTimeout = DefaultDeadConnTimeout
	}
	if c.ReconnectWait == 0 {
		c.ReconnectWait = defaultReconnectWait
	}
	if c.DeadConnTimeout < time.Second {
		return fmt.Errorf("nbd: dead connection timeout %s: want at least 1s", c.DeadConnTimeout)
	}
	return nil
}

// Run serves the volume's image on its nbd device until ctx ends: it
// reconnects the device a previous server left (found by backend
// identifier) or connects a new one. On return the device stays: the kernel
// queues I/O for DeadConnTimeout while the next server starts, then fails
// it until one does; whoever unstages the volume disconnects it.
func Run(ctx context.Context, c RunConfig) error {
	if err := c.defaults(); err != nil {
		return err
	}
	img, err := backing.Open(c.Image, c.Direct)
	if err != nil {
		return err
	}
	defer func() { _ = img.Close() }()
	log := c.Log.WithValues("volume", c.Volume)

	index, conns, reconnected, err := attach(ctx, c, img.Size(), log)
	if err != nil {
		return err
	}
	if t, ok := img.(backing.TakerOver); ok && reconnected {
		// The device's previous server is gone (its connections were dead):
		// its hold on the image must not make the first write wait.
		if err := t.TakeOver(); err != nil {
			log.Error(err, "previous server's hold on the image not freed; the first write waits until it lapses")
		}
	}
	if l, ok := img.(backing.Locker); ok {
		if err := l.Lock(); err != nil {
			return err
		}
	}
	defer func() {
		for _, f := range conns {
			_ = f.Close()
		}
	}()
	dev := DevicePath(index)
	log = log.WithValues("device", dev)
	log.Info("serving", "image", c.Image, "connections", len(conns), "direct", img.Direct())
	if c.OnReady != nil {
		c.OnReady(dev)
	}
	one := c
	one.Connections = 1
	redial := func(ctx context.Context) ([]*os.File, error) { return reconnect(ctx, one, index) }
	return serveAll(ctx, conns, redial, img, c.Workers, c.OnIOError, log)
}

// attach finds or makes the device and returns our ends of its sockets;
// reconnected tells that the device existed (a previous server's).
func attach(ctx context.Context, c RunConfig, size int64, log logr.Logger) (index int, conns []*os.File, reconnected bool, err error) {
	id := BackendID(c.Node, c.Volume)
	index, found, err := FindByBackend(c.Sysfs, id)
	if err != nil {
		return 0, nil, false, err
	}
	if found {
		connected, err := c.Kernel.Status(index)
		if err != nil {
			return 0, nil, false, err
		}
		if connected {
			log.Info("reconnecting", "device", DevicePath(index))
			conns, err := reconnect(ctx, c, index)
			return index, conns, true, err
		}
	}
	pairs, err := newPairs(c.Connections)
	if err != nil {
		return 0, nil, false, err
	}
	index, err = c.Kernel.Connect(ConnectParams{
		Index: -1, Size: size, Socks: pairs.kernel(),
		DeadConnTimeout: c.DeadConnTimeout, Backend: id,
	})
	pairs.closeKernel()
	if err != nil {
		pairs.closeOurs()
		return 0, nil, false, fmt.Errorf("connect nbd device for %s: %w", c.Volume, err)
	}
	return index, pairs.ours(), false, nil
}

// reconnect hands fresh sockets to the device. The kernel takes one per dead
// connection and silently drops the rest; a socket it did not take shows a
// hang-up on our end once our copy of its end is closed. None taken means
// the old connections are not seen dead yet (or another server is alive):
// retry for a while.
func reconnect(ctx context.Context, c RunConfig, index int) ([]*os.File, error) {
	deadline := time.Now().Add(c.ReconnectWait)
	for {
		pairs, err := newPairs(c.Connections)
		if err != nil {
			return nil, err
		}
		err = c.Kernel.Reconfigure(index, BackendID(c.Node, c.Volume), pairs.kernel(), c.DeadConnTimeout)
		pairs.closeKernel()
		if err != nil {
			pairs.closeOurs()
			return nil, fmt.Errorf("reconnect %s: %w", DevicePath(index), err)
		}
		if taken := pairs.taken(); len(taken) > 0 {
			return taken, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("reconnect %s: the kernel took none of %d sockets for %s: no dead connection (is another server serving it?)",
				DevicePath(index), c.Connections, c.ReconnectWait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(retryEvery):
		}
	}
}

// serveAll serves every connection. The kernel drops a connection on its
// own when a request outlives the request timer while other connections
// exist (nbd_xmit_timeout marks it dead and requeues the request): such a
// connection is replaced through redial while no NBD_CMD_DISC came. A
// protocol error ends all (the kernel requeues to the next server). It
// returns nil when ctx ended or the kernel disconnected, an error when
// every connection was lost and none could be replaced.
func serveAll(ctx context.Context, conns []*os.File, redial func(context.Context) ([]*os.File, error),
	b Backend, workers int, ioFailed func(), log logr.Logger) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type ended struct {
		f   *os.File
		err error
	}
	done := make(chan ended)
	active, next := 0, 0
	serve := func(f *os.File) {
		l := log.WithValues("conn", next)
		active++
		next++
		go func() { done <- ended{f, serve(ctx, f, b, workers, ioFailed, l)} }()
	}
	for _, f := range conns {
		serve(f)
	}
	var lost, fatal error
	discs := 0
	for active > 0 {
		e := <-done
		active--
		_ = e.f.Close() // its requests are answered; the peer sees the close
		switch err := e.err; {
		case err == nil:
			discs++
		case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		case errors.Is(err, ErrDisconnected):
			log.Info("connection lost", "err", err.Error())
			lost = err
			if discs > 0 || ctx.Err() != nil || redial == nil {
				break
			}
			fresh, rerr := redial(ctx)
			if rerr != nil {
				log.Error(rerr, "lost connection not replaced")
				break
			}
			for _, f := range fresh {
				serve(f)
			}
			log.Info("lost connection replaced", "connections", active)
		default:
			log.Error(err, "connection failed; stopping all")
			if fatal == nil {
				fatal = err
			}
			cancel()
		}
	}
	switch {
	case fatal != nil:
		return fatal
	case discs > 0:
		log.Info("device disconnected")
		return nil
	case lost != nil && ctx.Err() == nil:
		return fmt.Errorf("all connections lost: %w", lost)
	}
	return nil
}
