// Package blockdev serves a backend image as a kernel block device: a FUSE
// file system holding one file (disk.img) on which the caller attaches a loop
// device. The FUSE connection is owned by the keeper, so a server process can
// die and a new one take the connection over without the kernel noticing more
// than a stall.
package blockdev

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/blockdev/backing"
)

// ErrUnmounted means the kernel ended the connection (unmount or abort).
var ErrUnmounted = errors.New("fuse connection ended")

// Config describes one server.
type Config struct {
	// Dev is the /dev/fuse fd of a mounted connection (from the keeper).
	Dev int
	// Image is the backing image, opened read-write by the caller.
	Image backing.Image
	// Saved are the settings of the connection's first INIT; nil on a
	// fresh connection, whose INIT this server answers.
	Saved *Settings
	// OnInit stores negotiated settings (in the keeper) before INIT is
	// answered, so that a server dying right after still leaves them.
	OnInit func(Settings) error
	// Passthrough asks the kernel to do reads and writes on the image
	// itself (FUSE passthrough); the server then only answers metadata.
	Passthrough bool
	// Workers is the number of goroutines reading requests (default 16).
	Workers int
	// Hold, when set, is called on a takeover once the server is ready and
	// before the requests in the kernel are resent: it returns when the
	// agent lets the volume's I/O resume (launch.HoldGroup), or ctx ends.
	Hold func(context.Context)
	// IOErrors counts the requests the image failed (nil: not counted).
	IOErrors *IOErrors
	Log      logr.Logger
}

// Server answers FUSE requests for one image.
type Server struct {
	cfg      Config
	settings atomic.Pointer[Settings]
	ready    chan struct{}
	readyOne sync.Once
	noSplice sync.Once // logs once that workers read without splice
	stopping atomic.Bool
	inflight atomic.Int64
	start    uint64 // mtime of the file: the server's start, in seconds
	// async is the image's asynchronous I/O, nil if it has none; spare
	// holds the buffers of requests it finished, for the next ones.
	async backing.Async
	spare chan *buffers
}

// NewServer checks cfg; Serve starts the work.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Dev < 0 || cfg.Image == nil {
		return nil, errors.New("blockdev: server needs a fuse fd and an image")
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 16
	}
	if cfg.OnInit == nil {
		cfg.OnInit = func(Settings) error { return nil }
	}
	s := &Server{cfg: cfg, ready: make(chan struct{}), start: uint64(time.Now().Unix())}
	if a, ok := cfg.Image.(backing.Async); ok {
		s.async, s.spare = a, make(chan *buffers, spareBuffers)
	}
	if cfg.Saved != nil {
		saved := *cfg.Saved
		s.settings.Store(&saved)
	}
	return s, nil
}

// Ready is closed once the server answers requests: after INIT on a fresh
// connection, after the resend request on a takeover; on a held takeover
// (Config.Hold) before the hold, so that the agent knows the start is done
// while the volume's I/O still waits.
func (s *Server) Ready() <-chan struct{} { return s.ready }

func (s *Server) markReady() { s.readyOne.Do(func() { close(s.ready) }) }

// Serve runs the workers until ctx ends or the connection ends. On ctx end it
// stops taking requests and waits (bounded) for those in hand; requests a
// worker had read but not answered are left to the next server's resend.
func (s *Server) Serve(ctx context.Context) error {
	if s.cfg.Saved != nil {
		if err := s.ensureBacking(); err != nil {
			return err
		}
		if s.cfg.Hold != nil {
			s.markReady()
			s.cfg.Hold(ctx)
			if ctx.Err() != nil {
				// Stopped while held: the waiting requests stay queued
				// for the next server's resend; workers now would only
				// read them to leave them again.
				return nil
			}
		}
		if err := s.requestResend(); err != nil {
			return err
		}
		s.markReady()
	} else if err := s.requestResend(); err != nil && !errors.Is(err, unix.EINVAL) {
		// A fresh connection may still hold an INIT a dead server read but
		// never answered; the resend brings it back. Older kernels refuse.
		s.cfg.Log.Info("resend on fresh connection failed", "err", err)
	}
	done := make(chan error, s.cfg.Workers)
	for range s.cfg.Workers {
		go func() { done <- s.worker() }()
	}
	select {
	case err := <-done:
		s.stopping.Store(true)
		return err
	case <-ctx.Done():
	}
	s.stopping.Store(true)
	deadline := time.Now().Add(5 * time.Second)
	for s.inflight.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	return nil
}

// requestResend asks the kernel to queue again every request that a reader
// of this connection took but never answered (FUSE_NOTIFY_RESEND, 6.9+).
func (s *Server) requestResend() error {
	var msg [outHeaderSize]byte
	le.PutUint32(msg[0:], outHeaderSize)
	le.PutUint32(msg[4:], notifyResend)
	if _, err := unix.Write(s.cfg.Dev, msg[:]); err != nil {
		return fmt.Errorf("request resend (FUSE_NOTIFY_RESEND, kernel 6.9+): %w", err)
	}
	return nil
}

// worker reads and answers requests until the connection ends.
func (s *Server) worker() error {
	b, err := newBuffers()
	if err != nil {
		return err
	}
	defer func() { b.free() }()
	w := uint32(initMaxWrite)
	if set := s.settings.Load(); set != nil {
		w = set.Out.MaxWrite // a takeover: what the connection has
	}
	pipe, err := newRequestPipe(w)
	if err != nil {
		s.noSplice.Do(func() {
			s.cfg.Log.Error(err, "reading requests without splice: a server killed while it reads a request can fail that request with EIO")
		})
	}
	defer pipe.close()
	for {
		n, err := pipe.readRequest(s.cfg.Dev, b.in)
		switch {
		case err == nil:
		case errors.Is(err, unix.EINTR), errors.Is(err, unix.EAGAIN), errors.Is(err, unix.ENOENT):
			continue // ENOENT: the request was interrupted before we got it
		case errors.Is(err, unix.ENODEV):
			return ErrUnmounted
		default:
			return fmt.Errorf("read /dev/fuse: %w", err)
		}
		s.inflight.Add(1)
		if s.stopping.Load() {
			s.inflight.Add(-1)
			return nil
		}
		err = s.handle(b, n)
		s.inflight.Add(-1)
		if errors.Is(err, errLent) {
			// An asynchronous request took b along (its end gives it
			// back): b is no longer this worker's to look at.
			b, err = s.buffers()
		}
		if err != nil {
			return err
		}
	}
}

// spareBuffers is how many buffers of finished asynchronous requests a
// server keeps for the next ones; more in flight at once are mapped anew
// and unmapped when they end.
const spareBuffers = 64

// buffers returns a spare buffer set or maps a new one.
func (s *Server) buffers() (*buffers, error) {
	select {
	case b := <-s.spare:
		return b, nil
	default:
		return newBuffers()
	}
}

// giveBack keeps the buffers of a finished asynchronous request as a
// spare, or unmaps them.
func (s *Server) giveBack(b *buffers) {
	select {
	case s.spare <- b:
	default:
		b.free()
	}
}

// reply sends the reply whose payload (n bytes) is in b.outData.
func (s *Server) reply(b *buffers, unique uint64, errno unix.Errno, n int) error {
	if errno != 0 {
		n = 0
	}
	msg := b.out[outPad-outHeaderSize : outPad+n]
	putOutHeader(msg, len(msg), int32(errno), unique)
	_, err := unix.Write(s.cfg.Dev, msg)
	switch {
	case err == nil, errors.Is(err, unix.ENOENT):
		return nil // ENOENT: the kernel gave up on the request (interrupt)
	case errors.Is(err, unix.ENODEV):
		return ErrUnmounted
	default:
		return fmt.Errorf("write /dev/fuse: %w", err)
	}
}

// Buffer layout: requests are read at inPad-inHeaderSize-writeInSize so that
// WRITE data starts page aligned, and READ data is read at outPad, both as
// O_DIRECT on the image wants.
const (
	pageSize = 4096
	inPad    = pageSize
	outPad   = pageSize
	bufSize  = maxWrite + 2*pageSize
)

type buffers struct {
	inMem, outMem []byte
	in            []byte // what read(2) fills
	out           []byte
}

// newBuffers maps page-aligned memory once per worker: no allocation per
// request.
func newBuffers() (*buffers, error) {
	inMem, err := unix.Mmap(-1, 0, inPad+bufSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("map request buffer: %w", err)
	}
	outMem, err := unix.Mmap(-1, 0, outPad+maxWrite+pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		_ = unix.Munmap(inMem)
		return nil, fmt.Errorf("map reply buffer: %w", err)
	}
	return &buffers{
		inMem:  inMem,
		outMem: outMem,
		in:     inMem[inPad-inHeaderSize-writeInSize:],
		out:    outMem,
	}, nil
}

func (b *buffers) free() {
	_ = unix.Munmap(b.inMem)
	_ = unix.Munmap(b.outMem)
}

// data returns the reply payload area (page aligned).
func (b *buffers) data(n int) []byte { return b.out[outPad : outPad+n] }

// ioFailed counts a request the image failed (Config.IOErrors) and returns
// the errno the kernel gets for it.
func (s *Server) ioFailed(err error) unix.Errno {
	s.cfg.IOErrors.Add()
	return errnoOf(err)
}

// errnoOf maps an error to the errno the kernel gets (EIO if unknown).
func errnoOf(err error) unix.Errno {
	var e unix.Errno
	if errors.As(err, &e) {
		return e
	}
	var pe *os.PathError
	if errors.As(err, &pe) && errors.As(pe.Err, &e) {
		return e
	}
	return unix.EIO
}
