package ublk

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
)

// ServerConfig describes a device to serve. Zero values mean defaults.
type ServerConfig struct {
	// Dev is the directory of the device nodes: "" means /dev.
	Dev string
	// Backend holds the data; a Discarder also takes discards.
	Backend Backend
	// Size is the device size in bytes, whole 4 KiB blocks.
	Size int64
	// Depth is the queue depth: 0 means 128.
	Depth uint16
	// MaxIO is the largest request in bytes: 0 means 512 KiB.
	MaxIO uint32
	// ReadOnly makes the block device read-only.
	ReadOnly bool
	// OnIOError, when set, is called for each request the backend failed.
	OnIOError func()
	// Tag, when not 0, marks a new device as its volume's (Tag), and
	// Recover takes over only a device so marked.
	Tag uint64
}

// Tag is the mark of node's device of volume. The kernel keeps it with the
// device (the server's own flags, ublksrv_flags), so that a device number
// that a reboot, or another node sharing the kernel, gave to another
// volume is never taken for this one's.
func Tag(node, volume string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("berth\x00" + node + "\x00" + volume))
	if t := h.Sum64(); t != 0 {
		return t
	}
	return 1
}

// Server is a running ublk device server.
type Server struct {
	// ID is the device number: /dev/ublkbID.
	ID     uint32
	done   chan error
	cancel context.CancelFunc
}

// Stop ends the server as its death would: the device stays, its I/O
// queued, for Recover. Done then delivers context.Canceled.
func (s *Server) Stop() { s.cancel() }

// Done delivers the queue's end: nil when the device was stopped, else
// why it ended (ctx's error when the caller's context ended).
func (s *Server) Done() <-chan error { return s.done }

func (c ServerConfig) withDefaults() ServerConfig {
	if c.Depth == 0 {
		c.Depth = 128
	}
	if c.MaxIO == 0 {
		c.MaxIO = 512 << 10
	}
	return c
}

// params are the block device's: 4 KiB physical blocks, a volatile cache
// (the backend has one: flushes and FUA reach it as Sync), discards where
// the backend takes them.
func (c ServerConfig) params() Params {
	p := Params{Attrs: AttrVolatileCache | AttrFUA, LogicalBSShift: 9, PhysicalBSShift: 12,
		IOOptShift: 12, IOMinShift: 12, MaxSectors: c.MaxIO >> sectorShift,
		DevSectors: uint64(c.Size) >> sectorShift}
	if c.ReadOnly {
		p.Attrs |= AttrReadOnly
	}
	if _, ok := c.Backend.(Discarder); ok {
		p.DiscardGranularity, p.MaxDiscardSegments = 4096, 1
		p.MaxDiscardSectors, p.MaxWriteZeroesSectors = 1<<30>>sectorShift, 1<<30>>sectorShift
	}
	return p
}

// Serve adds a device with user recovery that reissues what a dead server
// held, serves its queue until ctx ends, and starts its block device. It
// returns once /dev/ublkbID exists. A failed start deletes the device.
// Where the driver can change a running device's size, the device is
// added so that UpdateSize can grow it.
func Serve(ctx context.Context, ctl *Control, cfg ServerConfig) (*Server, error) {
	cfg = cfg.withDefaults()
	if cfg.Size <= 0 || cfg.Size%4096 != 0 {
		return nil, fmt.Errorf("ublk: size %d: not whole 4 KiB blocks", cfg.Size)
	}
	features, err := ctl.Features()
	if err != nil {
		return nil, err
	}
	if err := RequireRecovery(features); err != nil {
		return nil, err
	}
	flags := FlagUserRecovery | FlagUserRecoveryReissue | features&FlagUpdateSize
	info, err := ctl.AddDevice(DevInfo{DevID: AnyDevice, NrHWQueues: 1, QueueDepth: cfg.Depth,
		MaxIOBufBytes: cfg.MaxIO, Flags: flags, ServerFlags: cfg.Tag})
	if err != nil {
		return nil, err
	}
	if info.Flags&FlagUserRecoveryReissue == 0 {
		err = fmt.Errorf("ublk: device %d granted flags %#x: %w", info.DevID, info.Flags, ErrNoRecovery)
	}
	if err == nil {
		err = ctl.SetParams(info.DevID, cfg.params())
	}
	var s *Server
	if err == nil {
		s, err = serveQueue(ctx, cfg, info, func() error { return ctl.StartDevice(info.DevID, os.Getpid()) })
	}
	if err != nil {
		return nil, errors.Join(err, ctl.DeleteDevice(info.DevID))
	}
	return s, nil
}

// Recover takes over device id, whose server died, and serves it until
// ctx ends: the kernel then resends the requests it queued meanwhile and
// those the dead server held. cfg must describe the same device (size,
// backend); with a Tag, a device marked otherwise is refused before
// anything is asked of it.
func Recover(ctx context.Context, ctl *Control, id uint32, cfg ServerConfig) (*Server, error) {
	cfg = cfg.withDefaults()
	if cfg.Tag != 0 {
		info, err := ctl.DeviceInfo(id)
		if err != nil {
			return nil, err
		}
		if info.ServerFlags != cfg.Tag {
			return nil, fmt.Errorf("ublk: device %d is marked %#x, not %#x: %w", id, info.ServerFlags, cfg.Tag, ErrNotThisDevice)
		}
	}
	if err := ctl.StartRecovery(id); err != nil {
		return nil, err
	}
	info, err := ctl.DeviceInfo(id)
	if err != nil {
		return nil, err
	}
	return serveQueue(ctx, cfg, info, func() error { return ctl.EndRecovery(id, os.Getpid()) })
}

// serveQueue starts the queue and, once it has fetched, runs start (the
// command that waits for the fetches).
func serveQueue(ctx context.Context, cfg ServerConfig, info DevInfo, start func() error) (*Server, error) {
	q, err := NewQueue(QueueConfig{Dev: cfg.Dev, Info: info, Size: cfg.Size, Backend: cfg.Backend, OnIOError: cfg.OnIOError})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &Server{ID: info.DevID, done: make(chan error, 1), cancel: cancel}
	ready := make(chan struct{})
	go func() { s.done <- q.Serve(ctx, func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-s.done:
		cancel()
		return nil, fmt.Errorf("ublk: device %d: queue: %w", info.DevID, err)
	}
	if err := start(); err != nil {
		cancel()
		<-s.done
		return nil, err
	}
	return s, nil
}
