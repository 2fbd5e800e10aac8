package ublk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"os"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Backend is what a queue serves: a volume's image (backing.Data fits).
// A read may come back short only at the image's end; the rest reads as
// zeros.
type Backend interface {
	io.ReaderAt
	io.WriterAt
	// Sync makes written data durable: flushes and FUA writes.
	Sync() error
}

// Discarder is a Backend that applies fallocate(2) modes to a range: it
// serves discards and write-zeroes without writing data.
type Discarder interface {
	Fallocate(mode uint32, off, length int64) error
}

// Restater is a Backend whose size may grow behind the server (an image
// the agent expanded). The kernel sends a request past the size the queue
// knows only once the device grew (UPDATE_SIZE): the queue then asks the
// backend for its size again.
type Restater interface {
	Restat() (int64, error)
}

// QueueConfig describes one queue of a device the kernel has added.
type QueueConfig struct {
	// Dev is the directory of the device nodes: "" means /dev.
	Dev string
	// Info is the device as the kernel has it (AddDevice, DeviceInfo):
	// its number, queue depth and largest request.
	Info DevInfo
	// Queue is the queue's number; berth serves queue 0 only so far.
	Queue uint16
	// Size is the device size in bytes, as SET_PARAMS told the kernel.
	Size int64
	// Backend holds the data.
	Backend Backend
	// OnIOError, when set, is called for each request the backend failed.
	OnIOError func()
}

// abortRes is UBLK_IO_RES_ABORT: the kernel ends a fetch for good (the
// device stops, or the queue is being torn down).
var abortRes = -int32(unix.ENODEV)

// pollEvery bounds how long a queue waits in the kernel before it looks at
// its context again.
const pollEvery = 100 * time.Millisecond

// Queue serves one queue of a ublk device: it fetches requests
// (FETCH_REQ), does them on the backend and commits their results with the
// next fetch (COMMIT_AND_FETCH_REQ). Requests are served one at a time on
// one OS thread, because the driver takes a queue's commands only from the
// thread that fetched them.
type Queue struct {
	cfg   QueueConfig
	depth int
	maxIO int
}

// NewQueue checks cfg and returns its queue, not yet serving.
func NewQueue(cfg QueueConfig) (*Queue, error) {
	var errs []error
	if cfg.Info.QueueDepth == 0 || cfg.Info.QueueDepth > maxQueueDepth {
		errs = append(errs, fmt.Errorf("queue depth %d (1 to %d)", cfg.Info.QueueDepth, maxQueueDepth))
	}
	if cfg.Info.MaxIOBufBytes < uint32(os.Getpagesize()) {
		errs = append(errs, fmt.Errorf("largest request %d bytes, under a page", cfg.Info.MaxIOBufBytes))
	}
	if cfg.Queue >= cfg.Info.NrHWQueues {
		errs = append(errs, fmt.Errorf("queue %d of a device with %d", cfg.Queue, cfg.Info.NrHWQueues))
	}
	if cfg.Size <= 0 || cfg.Size%512 != 0 {
		errs = append(errs, fmt.Errorf("size %d (whole sectors)", cfg.Size))
	}
	if cfg.Backend == nil {
		errs = append(errs, errors.New("no backend"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("ublk: queue: %w", err)
	}
	return &Queue{cfg: cfg, depth: int(cfg.Info.QueueDepth), maxIO: int(cfg.Info.MaxIOBufBytes)}, nil
}

// Serve opens the device's char device, fetches a request for every tag,
// calls ready (the kernel then takes START_DEV or END_USER_RECOVERY), and
// serves until the kernel aborts the fetches (the device stopped: nil) or
// ctx ends (ctx's error). Returning closes the char device and the ring,
// which to the kernel is the server's death: a device with user recovery
// keeps its I/O queued for the next server.
func (q *Queue) Serve(ctx context.Context, ready func()) error {
	// Never unlocked: if Serve returns the thread ends with it, as the
	// driver expects of a queue's thread.
	runtime.LockOSThread()

	path := CharPath(q.cfg.Dev, q.cfg.Info.DevID)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("ublk: open %s: %w", path, err)
	}
	defer unix.Close(fd)
	page := os.Getpagesize()
	descs, err := unix.Mmap(fd, cmdBufOff(int(q.cfg.Queue), page), cmdBufSize(q.depth, page),
		unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("ublk: mmap of %s's descriptors: %w", path, err)
	}
	defer unix.Munmap(descs)
	// The data buffers: the kernel copies write data in before it hands a
	// request over and read data out at the commit.
	bufs, err := unix.Mmap(-1, 0, q.depth*q.maxIO, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return fmt.Errorf("ublk: I/O buffers: %w", err)
	}
	defer unix.Munmap(bufs)
	r, err := newRing(uint32(1)<<bits.Len(uint(q.depth-1)), false)
	if err != nil {
		return fmt.Errorf("ublk: %w", err)
	}
	defer r.close()

	buf := func(tag int) []byte { return bufs[tag*q.maxIO : (tag+1)*q.maxIO] }
	send := func(op uint32, tag int, res int32) error {
		var b [ioCmdSize]byte
		c := ioCmd{QID: q.cfg.Queue, Tag: uint16(tag), Result: res,
			Addr: uint64(uintptr(unsafe.Pointer(&buf(tag)[0])))}
		c.encode(b[:])
		return r.queueCmd(fd, op, b[:], uint64(tag))
	}
	for tag := range q.depth {
		if err := send(uIOFetchReq, tag, -1); err != nil {
			return fmt.Errorf("ublk: fetch of tag %d: %w", tag, err)
		}
	}
	if err := r.submit(); err != nil {
		return fmt.Errorf("ublk: fetch: %w", err)
	}
	if ready != nil {
		ready()
	}

	size := q.cfg.Size // grows when the device does (Restater)
	live := q.depth    // tags whose fetch the kernel has not aborted
	var cqes []cqe
	for live > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := r.wait(pollEvery); err != nil {
			return fmt.Errorf("ublk: %w", err)
		}
		cqes = r.reap(cqes[:0])
		for _, c := range cqes {
			tag := int(c.userData)
			switch {
			case tag >= q.depth:
				return fmt.Errorf("ublk: completion for tag %d of %d", tag, q.depth)
			case c.res == abortRes:
				live--
				continue
			case c.res != ioResOK:
				return fmt.Errorf("ublk: fetch of tag %d: %w", tag, unix.Errno(-c.res))
			}
			d, err := DecodeIODesc(descs[tag*ioDescSize:])
			if err != nil {
				return err
			}
			size = grownSize(q.cfg.Backend, d, size)
			res := serveRequest(q.cfg.Backend, d, buf(tag), size)
			if res < 0 && res != -int32(unix.EOPNOTSUPP) && q.cfg.OnIOError != nil {
				q.cfg.OnIOError()
			}
			if err := send(uIOCommitAndFetch, tag, res); err != nil {
				return fmt.Errorf("ublk: commit of tag %d: %w", tag, err)
			}
		}
		if err := r.submit(); err != nil {
			return fmt.Errorf("ublk: commit: %w", err)
		}
	}
	return nil
}

// grownSize is the device size to check d against: size, or the
// backend's new size when d ends past size and the backend has grown
// since (whole 4 KiB blocks, as the agent sets the device's).
func grownSize(b Backend, d IODesc, size int64) int64 {
	sectors := uint64(size) >> sectorShift
	if d.Op() == OpFlush || (d.StartSector <= sectors && uint64(d.NrSectors) <= sectors-d.StartSector) {
		return size
	}
	r, ok := b.(Restater)
	if !ok {
		return size
	}
	if n, err := r.Restat(); err == nil && n&^4095 > size {
		return n &^ 4095
	}
	return size
}

// serveRequest does one request on b and returns what the commit reports:
// bytes done, or a negative errno. buf is the tag's buffer; size the
// device's.
func serveRequest(b Backend, d IODesc, buf []byte, size int64) int32 {
	if d.Op() == OpFlush {
		// A flush covers no range: the kernel leaves its sector as it
		// finds it, so it is not checked.
		return errno(b.Sync())
	}
	off, n, err := d.Range(size, len(buf))
	if err != nil {
		return -int32(unix.EIO)
	}
	switch d.Op() {
	case OpRead:
		got, err := b.ReadAt(buf[:n], off)
		if err != nil && got < int(n) && !isEOF(err) {
			return errno(err)
		}
		clear(buf[got:n]) // past the image's end: zeros
		return int32(n)
	case OpWrite:
		if _, err := b.WriteAt(buf[:n], off); err != nil {
			return errno(err)
		}
		if d.Flags()&IOFlagFUA != 0 {
			if err := b.Sync(); err != nil {
				return errno(err)
			}
		}
		return int32(n)
	case OpDiscard:
		if f, ok := b.(Discarder); ok {
			return errno(f.Fallocate(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n))
		}
		return -int32(unix.EOPNOTSUPP)
	case OpWriteZeroes:
		if f, ok := b.(Discarder); ok {
			mode := uint32(unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE)
			if d.Flags()&IOFlagNoUnmap != 0 {
				mode = unix.FALLOC_FL_ZERO_RANGE | unix.FALLOC_FL_KEEP_SIZE
			}
			if f.Fallocate(mode, off, n) == nil {
				return 0
			}
		}
		// No fallocate: write zeros through the tag's buffer, which this
		// request does not use for data.
		clear(buf)
		for done := int64(0); done < n; {
			chunk := min(n-done, int64(len(buf)))
			if _, err := b.WriteAt(buf[:chunk], off+done); err != nil {
				return errno(err)
			}
			done += chunk
		}
		return 0
	}
	return -int32(unix.EOPNOTSUPP)
}

// errno is err as a commit result: 0, or a negative errno (EIO where err
// carries none).
func errno(err error) int32 {
	if err == nil {
		return 0
	}
	var e unix.Errno
	if errors.As(err, &e) && e != 0 {
		return -int32(e)
	}
	return -int32(unix.EIO)
}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }
