// Package imagefile is a volume's backing image file as the userspace block
// device servers (FUSE and nbd) read and write it.
package imagefile

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Image is the backing file. Aligned I/O goes through an O_DIRECT handle (no
// second page cache under the loop device's); the rest through a buffered one.
type Image struct {
	direct   *os.File // nil when O_DIRECT is off or unsupported (tmpfs)
	buffered *os.File
	size     atomic.Int64
}

// Open opens an existing image read-write.
func Open(path string, direct bool) (*Image, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open image: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("stat image: %w", err)
	}
	if !st.Mode().IsRegular() {
		_ = f.Close()
		return nil, fmt.Errorf("image %s is not a regular file", path)
	}
	img := &Image{buffered: f}
	img.size.Store(st.Size())
	if direct {
		d, err := os.OpenFile(path, os.O_RDWR|unix.O_DIRECT, 0)
		switch {
		case err == nil:
			img.direct = d
		case errors.Is(err, unix.EINVAL):
			// The file system has no O_DIRECT: buffered only.
		default:
			_ = f.Close()
			return nil, fmt.Errorf("open image with O_DIRECT: %w", err)
		}
	}
	return img, nil
}

// Size is the image size in bytes.
func (i *Image) Size() int64 { return i.size.Load() }

// Restat re-reads the size from the file: the backend grows the image
// behind the server (online expansion), and the kernel must be told the new
// size when it asks for the attributes. On error the known size is kept.
func (i *Image) Restat() (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(i.buffered.Fd()), &st); err != nil {
		return i.size.Load(), fmt.Errorf("stat image: %w", err)
	}
	i.grow(st.Size)
	return i.size.Load(), nil
}

// Fd is the buffered handle's descriptor: FUSE passthrough hands it to the
// kernel, which then does the data I/O itself.
func (i *Image) Fd() uintptr { return i.buffered.Fd() }

// Direct says whether aligned I/O bypasses the page cache.
func (i *Image) Direct() bool { return i.direct != nil }

const dioAlign = 512

func (i *Image) pick(p []byte, off int64) *os.File {
	if i.direct == nil || len(p) == 0 {
		return i.buffered
	}
	addr := uintptr(unsafe.Pointer(&p[0]))
	if off%dioAlign != 0 || len(p)%dioAlign != 0 || addr%dioAlign != 0 {
		return i.buffered
	}
	return i.direct
}

// checkRange refuses an offset the kernel would never send: negative, or one
// whose end overflows. pwrite of zero bytes would not catch it.
func checkRange(op string, n int, off int64) error {
	if off < 0 || off > math.MaxInt64-int64(n) {
		return fmt.Errorf("%s image at %d+%d: %w", op, off, n, unix.EINVAL)
	}
	return nil
}

// ReadAt reads up to len(p) bytes; fewer only at the end of the image.
func (i *Image) ReadAt(p []byte, off int64) (int, error) {
	return i.transfer("read", unix.Pread, p, off)
}

// WriteAt writes all of p.
func (i *Image) WriteAt(p []byte, off int64) (int, error) {
	n, err := i.transfer("write", unix.Pwrite, p, off)
	if err == nil && n < len(p) {
		err = fmt.Errorf("write image at %d: %w", off, io.ErrShortWrite)
	}
	if err != nil {
		return n, err
	}
	i.grow(off + int64(n))
	return n, nil
}

// transfer runs pread or pwrite (sys) on the file picked for p until all of
// p is done or sys moves nothing (the end of the image, for a read),
// retrying EINTR.
func (i *Image) transfer(op string, sys func(fd int, p []byte, off int64) (int, error), p []byte, off int64) (int, error) {
	if err := checkRange(op, len(p), off); err != nil {
		return 0, err
	}
	fd := int(i.pick(p, off).Fd())
	n := 0
	for n < len(p) {
		m, err := sys(fd, p[n:], off+int64(n))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return n, fmt.Errorf("%s image at %d: %w", op, off, err)
		}
		if m == 0 {
			break
		}
		n += m
	}
	return n, nil
}

// grow raises the known size to end if the image grew.
func (i *Image) grow(end int64) {
	for {
		cur := i.size.Load()
		if end <= cur || i.size.CompareAndSwap(cur, end) {
			return
		}
	}
}

// Sync makes written data durable.
func (i *Image) Sync() error {
	if err := unix.Fdatasync(int(i.buffered.Fd())); err != nil {
		return fmt.Errorf("sync image: %w", err)
	}
	return nil
}

// Truncate sets the image size (volume expansion).
func (i *Image) Truncate(size int64) error {
	if err := i.buffered.Truncate(size); err != nil {
		return fmt.Errorf("resize image: %w", err)
	}
	i.size.Store(size)
	return nil
}

// Fallocate applies fallocate(2) mode to a range; a size it grows is seen.
func (i *Image) Fallocate(mode uint32, off, length int64) error {
	if err := unix.Fallocate(int(i.buffered.Fd()), mode, off, length); err != nil {
		return fmt.Errorf("fallocate image (mode %#x): %w", mode, err)
	}
	if mode&unix.FALLOC_FL_KEEP_SIZE == 0 {
		i.grow(off + length)
	}
	return nil
}

// Close closes the image.
func (i *Image) Close() error {
	var err error
	if i.direct != nil {
		err = i.direct.Close()
	}
	return errors.Join(err, i.buffered.Close())
}
