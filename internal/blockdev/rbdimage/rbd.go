//go:build ceph

package rbdimage

import (
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"

	"github.com/ceph/go-ceph/rados"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/backend/ceph/cephaddr"
)

// Built tells whether this binary can serve RBD images.
const Built = true

// connectTimeout bounds connecting to the monitors; OSD requests have no
// timeout: an OSD down stalls I/O (as a disk would), it never fails it.
const connectTimeout = "10"

// Image is an open RBD image.
type Image struct {
	conn  *rados.Conn
	ioctx *rados.IOContext
	img   *rbdHandle
	size  atomic.Int64
	// exclusive: Lock takes the image's lock (Access.Exclusive).
	exclusive bool
	// previous are the Ceph clients the previous server of the same
	// access file recorded: the only owners TakeOver breaks.
	previous []string
}

// Open connects as the access file at path says, opens its image and
// records this client's addresses beside the access file (ClientsPath).
func Open(path string) (*Image, error) {
	a, err := Read(path)
	if err != nil {
		return nil, err
	}
	conn, err := rados.NewConnWithUser(a.Client)
	if err != nil {
		return nil, fmt.Errorf("ceph client %s: %w", a.Client, err)
	}
	// The previous server's addresses, before this one replaces them.
	previous, err := ReadClients(path)
	if err != nil {
		conn.Shutdown()
		return nil, err
	}
	i := &Image{conn: conn, exclusive: a.Exclusive, previous: previous}
	if err := i.open(a); err != nil {
		i.close()
		return nil, err
	}
	// Failing here fails the start: a server that says ready has always
	// replaced the addresses of the one before.
	addrs, err := cephaddr.Client(conn)
	if err == nil {
		err = writeClients(path, addrs)
	}
	if err != nil {
		i.close()
		return nil, err
	}
	return i, nil
}

func (i *Image) open(a Access) error {
	// No ceph.conf: everything comes from the access file. The key is an
	// option, never on a command line. No librbd cache: a write the kernel
	// was told is done must be in Ceph when the server is SIGKILLed.
	// Partial discards zero their range: the loop device turns the
	// kernel's write-zeroes into a punched hole, which must read as zeros.
	opts := [][2]string{
		{"mon_host", a.MonHost},
		{"key", a.Key},
		{"auth_client_required", "cephx"},
		{"client_mount_timeout", connectTimeout},
		{"rbd_cache", "false"},
		{"rbd_skip_partial_discard", "false"},
		{"admin_socket", ""},
		{"log_file", ""},
		{"log_to_stderr", "false"},
		{"err_to_stderr", "false"},
	}
	for _, o := range opts {
		if err := i.conn.SetConfigOption(o[0], o[1]); err != nil {
			return fmt.Errorf("ceph option %s: %w", o[0], err)
		}
	}
	if err := i.conn.Connect(); err != nil {
		return fmt.Errorf("connect to ceph monitors %s as client.%s: %w", a.MonHost, a.Client, explain(err))
	}
	ioctx, err := i.conn.OpenIOContext(a.Pool)
	if err != nil {
		return fmt.Errorf("open pool %s: %w", a.Pool, explain(err))
	}
	i.ioctx = ioctx
	img, err := openRBD(ioctx, a.Image)
	if err != nil {
		return fmt.Errorf("open RBD image %s/%s: %w", a.Pool, a.Image, explain(err))
	}
	i.img = img
	size, err := img.size()
	if err != nil {
		return fmt.Errorf("size of RBD image %s/%s: %w", a.Pool, a.Image, err)
	}
	i.size.Store(int64(size))
	return nil
}

// explain names what a connection errno means.
func explain(err error) error {
	var ce interface{ ErrorCode() int }
	if !errors.As(err, &ce) {
		return err
	}
	switch syscall.Errno(max(ce.ErrorCode(), -ce.ErrorCode())) {
	case syscall.EACCES, syscall.EPERM:
		return fmt.Errorf("%w: %w", ErrRefused, err)
	case syscall.ETIMEDOUT:
		return fmt.Errorf("%w (%ss): %w", ErrUnreachable, connectTimeout, err)
	case syscall.ENOENT:
		return fmt.Errorf("not found: %w", err)
	}
	return err
}

// close releases what is open; a second call does nothing (librbd would
// free the image twice).
func (i *Image) close() {
	if i.img != nil {
		_ = i.img.close()
		i.img = nil
	}
	if i.ioctx != nil {
		i.ioctx.Destroy()
		i.ioctx = nil
	}
	if i.conn != nil {
		i.conn.Shutdown()
		i.conn = nil
	}
}

// Close flushes nothing (there is no cache) and disconnects; the image's
// exclusive lock goes with it.
func (i *Image) Close() error {
	i.close()
	return nil
}

// TakeOver breaks the image's exclusive lock where the server that died
// left it: otherwise the first write waits until the dead client's watch
// lapses (30 s). Call it only when that server is known gone (the keeper
// handed its connection on). It breaks only a lock of the clients the
// previous server of this access file recorded (F14): another node's
// server that took the image meanwhile keeps its lock. librbd blocklists
// the owner's client as it breaks the lock.
func (i *Image) TakeOver() error {
	if len(i.previous) == 0 {
		return nil
	}
	if err := i.img.breakLocksOf(i.previous); err != nil {
		return fmt.Errorf("break the RBD image's lock of %v: %w", i.previous, err)
	}
	return nil
}

// Lock takes the image's exclusive lock for an exclusive access file, in
// librbd's explicit mode: this client then refuses to hand the lock to
// any other, whose writes fail instead of taking turns with ours. A live
// owner's lock is never broken here: that is lock breaking's business,
// which fences the owner first.
func (i *Image) Lock() error {
	if !i.exclusive {
		return nil
	}
	switch err := i.img.lockExclusive(); {
	case err == nil:
		return nil
	case errors.Is(err, syscall.EROFS), errors.Is(err, syscall.EBUSY):
		return fmt.Errorf("%w: %w", ErrLocked, err)
	case errors.Is(err, syscall.EINVAL):
		// An image without the exclusive-lock feature (made outside
		// berth): nothing to hold; the Attachment alone fences it.
		return nil
	default:
		return fmt.Errorf("take the RBD image's exclusive lock: %w", err)
	}
}

// Size is the last known size.
func (i *Image) Size() int64 { return i.size.Load() }

// Restat asks librbd for the size, which it refreshes when the controller
// resizes the image (online expansion).
func (i *Image) Restat() (int64, error) {
	size, err := i.img.size()
	if err != nil {
		return i.size.Load(), fmt.Errorf("size of RBD image: %w", err)
	}
	i.size.Store(int64(size))
	return int64(size), nil
}

// workers is the FUSE server's request workers on an RBD image. Reads and
// writes are asynchronous (StartRead, StartWrite): a worker only takes
// requests and starts them, so a few keep librbd's queue full; the rest
// (fsync, discard, resize) wait on librbd, rare enough for the few.
const workers = 8

// Workers is how many request workers the server should run.
func (*Image) Workers() int { return workers }

// Direct: librbd has no page cache here (rbd_cache off).
func (*Image) Direct() bool { return true }

// ReadAt reads up to len(p) bytes; fewer only at the end of the image.
func (i *Image) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, unix.EINVAL
	}
	if size := i.size.Load(); off+int64(len(p)) > size {
		// librbd refuses a read past the end; the file ends there.
		if off >= size {
			return 0, nil
		}
		p = p[:size-off]
	}
	n, err := i.img.rw(false, p, off)
	if err != nil {
		return n, fmt.Errorf("read RBD image at %d: %w", off, err)
	}
	return n, nil
}

// StartRead starts reading len(p) bytes at off; done gets how many were
// read (fewer only at the end of the image).
func (i *Image) StartRead(p []byte, off int64, done func(int, error)) error {
	if off < 0 {
		return unix.EINVAL
	}
	if size := i.size.Load(); off+int64(len(p)) > size {
		if off >= size {
			done(0, nil)
			return nil
		}
		p = p[:size-off]
	}
	if len(p) == 0 {
		done(0, nil)
		return nil
	}
	return i.img.aio(false, p, off, func(n int, err error) {
		if err != nil {
			err = fmt.Errorf("read RBD image at %d: %w", off, err)
		}
		done(n, err)
	})
}

// StartWrite starts writing all of p at off; done gets len(p) once the
// OSDs have it (no cache: what done acknowledges survives this process).
func (i *Image) StartWrite(p []byte, off int64, done func(int, error)) error {
	if off < 0 {
		return unix.EINVAL
	}
	if len(p) == 0 {
		done(0, nil)
		return nil
	}
	// A write's completion returns 0, not the bytes written.
	return i.img.aio(true, p, off, func(_ int, err error) {
		if err != nil {
			done(0, fmt.Errorf("write RBD image at %d: %w", off, err))
			return
		}
		done(len(p), nil)
	})
}

// WriteAt writes all of p.
func (i *Image) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, unix.EINVAL
	}
	n, err := i.img.rw(true, p, off)
	if err != nil {
		return n, fmt.Errorf("write RBD image at %d: %w", off, err)
	}
	return n, nil
}

// Sync waits for every write to be in Ceph (there is no cache, so it is
// cheap).
func (i *Image) Sync() error {
	if err := i.img.flush(); err != nil {
		return fmt.Errorf("flush RBD image: %w", err)
	}
	return nil
}

// Truncate resizes the image.
func (i *Image) Truncate(size int64) error {
	if size < 0 {
		return unix.EINVAL
	}
	if err := i.img.resize(size); err != nil {
		return fmt.Errorf("resize RBD image: %w", err)
	}
	i.size.Store(size)
	return nil
}

// Fallocate serves punch hole and zero range as a discard (which zeroes,
// see open); a plain allocation succeeds without doing anything (RBD
// images are thin), or grows the image when it reaches past the end.
func (i *Image) Fallocate(mode uint32, off, length int64) error {
	if off < 0 || length <= 0 {
		return unix.EINVAL
	}
	const supported = unix.FALLOC_FL_KEEP_SIZE | unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_ZERO_RANGE
	if mode&^supported != 0 {
		return unix.EOPNOTSUPP
	}
	if mode&(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_ZERO_RANGE) != 0 {
		size := i.size.Load()
		if off >= size {
			return nil
		}
		if err := i.img.discard(off, min(length, size-off)); err != nil {
			return fmt.Errorf("discard RBD image at %d+%d: %w", off, length, err)
		}
		return nil
	}
	if mode&unix.FALLOC_FL_KEEP_SIZE == 0 && off+length > i.size.Load() {
		return i.Truncate(off + length)
	}
	return nil
}
