package blockdev

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-io/berth/internal/blockdev/backing"
	"github.com/berth-io/berth/internal/keeper"
)

// Keeper is what a server needs from the keeper client.
type Keeper interface {
	Open(ctx context.Context, volume, mountpoint string) (*keeper.Conn, error)
	SaveInit(ctx context.Context, volume string, settings []byte) error
}

var _ Keeper = (*keeper.Client)(nil)

// RunConfig is one server process's work: take the volume's connection from
// the keeper (opening and mounting it if new) and serve Image on it.
type RunConfig struct {
	Keeper     Keeper
	Volume     string
	Mountpoint string
	Image      string
	// Direct opens the image with O_DIRECT for aligned I/O.
	Direct bool
	// Passthrough lets the kernel do data I/O on the image itself.
	Passthrough bool
	// Workers is the request goroutines (0: the image's own default when it
	// is a backing.Parallel, else the server's).
	Workers int
	// OnReady is called once the server answers requests.
	OnReady func()
	// Hold (a takeover only), when set, returns when the volume's I/O may
	// resume (HoldFor) or ctx ends; nil: at once.
	Hold func(ctx context.Context)
	// IOErrors counts the requests the image failed (nil: not counted).
	IOErrors *IOErrors
	Log      logr.Logger
}

// HoldFor is a RunConfig.Hold that waits until the agent closes r's other
// end (or dies), or max has passed: a bound, so that no volume waits long
// for the others of its heal pass.
// A stop (ctx) ends the hold at once, so that SIGTERM is not kept waiting.
func HoldFor(r io.ReadCloser, max time.Duration) func(context.Context) {
	return func(ctx context.Context) {
		done := make(chan struct{})
		go func() {
			_, _ = io.Copy(io.Discard, r)
			close(done)
		}()
		timer := time.NewTimer(max)
		defer timer.Stop()
		select {
		case <-done:
		case <-timer.C:
		case <-ctx.Done():
		}
		_ = r.Close()
	}
}

// servedWait bounds how long a new server waits for the previous one to be
// gone: a killed server can take a moment to exit (I/O in flight).
const servedWait = 15 * time.Second

// openConn takes the connection, waiting while the previous server exits.
func openConn(ctx context.Context, c RunConfig) (*keeper.Conn, error) {
	deadline := time.Now().Add(servedWait)
	for {
		conn, err := c.Keeper.Open(ctx, c.Volume, c.Mountpoint)
		if !errors.Is(err, keeper.ErrServed) || time.Now().After(deadline) {
			return conn, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// startTimes are the steps of a server's start, each rounded to a
// millisecond.
type startTimes struct {
	last                        time.Time
	open, conn, breakLock, lock time.Duration
}

// lap is the time since the previous lap.
func (t *startTimes) lap() time.Duration {
	now := time.Now()
	d := now.Sub(t.last).Round(time.Millisecond)
	t.last = now
	return d
}

// workersFor is the request workers of a server of img: n when set, else
// the image's own count (backing.Parallel), else 0 (the server's default).
func workersFor(img backing.Image, n int) int {
	if p, ok := img.(backing.Parallel); ok && n <= 0 {
		return p.Workers()
	}
	return n
}

// Run serves until ctx ends or the connection is unmounted.
func Run(ctx context.Context, c RunConfig) error {
	log := c.Log.WithValues("volume", c.Volume)
	// Where a start's time goes, for the "serving" line: a heal of many
	// volumes is as fast as its slowest step.
	took := startTimes{last: time.Now()}
	// The image first: one that cannot be opened (a refused Ceph key) makes
	// the keeper mount nothing.
	img, err := backing.Open(c.Image, c.Direct)
	if err != nil {
		return err
	}
	defer func() { _ = img.Close() }()
	took.open = took.lap()
	conn, err := openConn(ctx, c)
	if err != nil {
		return fmt.Errorf("take connection of %s from keeper: %w", c.Volume, err)
	}
	took.conn = took.lap()
	defer func() { _ = conn.File.Close() }()
	saved, err := ParseSettings(conn.Settings)
	if err != nil {
		return err
	}
	if t, ok := img.(backing.TakerOver); ok && saved != nil {
		// A takeover: the previous server is gone, its hold on the image
		// must not make the first write wait.
		if err := t.TakeOver(); err != nil {
			log.Error(err, "previous server's hold on the image not freed; the first write waits until it lapses")
		}
	}
	took.breakLock = took.lap()
	if l, ok := img.(backing.Locker); ok {
		if err := l.Lock(); err != nil {
			return err
		}
	}
	took.lock = took.lap()
	// The kernel can do I/O itself only on an image with a descriptor.
	_, hasFd := img.(backing.Descriptor)
	workers := workersFor(img, c.Workers)
	srv, err := NewServer(Config{
		Dev:   int(conn.File.Fd()),
		Image: img,
		Saved: saved,
		OnInit: func(s Settings) error {
			b, err := s.Marshal()
			if err != nil {
				return err
			}
			if err := c.Keeper.SaveInit(ctx, c.Volume, b); err != nil {
				return fmt.Errorf("save INIT settings in keeper: %w", err)
			}
			return nil
		},
		Workers:     workers,
		Hold:        c.Hold,
		Passthrough: c.Passthrough && hasFd,
		IOErrors:    c.IOErrors,
		Log:         log,
	})
	if err != nil {
		return err
	}
	log.Info("serving", "image", c.Image, "takeover", saved != nil, "direct", img.Direct(), "workers", workers,
		"openImage", took.open, "takeConnection", took.conn, "breakLock", took.breakLock, "lock", took.lock)
	if c.OnReady != nil {
		go func() {
			select {
			case <-srv.Ready():
				c.OnReady()
			case <-ctx.Done():
			}
		}()
	}
	err = srv.Serve(ctx)
	if errors.Is(err, ErrUnmounted) {
		log.Info("connection ended")
		return nil
	}
	return err
}
