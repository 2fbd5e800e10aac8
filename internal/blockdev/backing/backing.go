// Package backing is what a userspace block device server serves: a
// volume's image, a file (imagefile) or an RBD image (rbdimage), behind one
// interface so that the FUSE and nbd servers never ask which.
package backing

import (
	"strings"

	"github.com/berth-io/berth/internal/blockdev/imagefile"
	"github.com/berth-io/berth/internal/blockdev/rbdimage"
)

// Data is the I/O on an image's content: all the nbd server needs.
type Data interface {
	// ReadAt reads up to len(p) bytes; fewer only at the end of the image.
	ReadAt(p []byte, off int64) (int, error)
	// WriteAt writes all of p.
	WriteAt(p []byte, off int64) (int, error)
	// Sync makes written data durable.
	Sync() error
	// Fallocate applies fallocate(2) mode to a range (discard, zeroing).
	Fallocate(mode uint32, off, length int64) error
	// Size is the last known size.
	Size() int64
}

// Image is a volume's image as a server reads and writes it.
type Image interface {
	Data
	// Restat asks the backend for the size again (the image grows behind
	// the server on expansion).
	Restat() (int64, error)
	// Truncate sets the size (the kernel's setattr).
	Truncate(size int64) error
	// Direct says whether aligned I/O bypasses a page cache.
	Direct() bool
	Close() error
}

// Descriptor is an Image with a file descriptor the kernel can do data I/O
// on itself (FUSE passthrough); an RBD image has none.
type Descriptor interface {
	Fd() uintptr
}

// TakerOver is an Image that a previous server's client may still hold
// (an RBD image's exclusive lock): TakeOver frees it from that dead server.
type TakerOver interface {
	TakeOver() error
}

// Locker is an Image a server must lock before it serves (an RBD image
// served read-write: its exclusive lock, with no hand-over to another
// client). Lock fails if another live client holds it.
type Locker interface {
	Lock() error
}

// Parallel is an Image each of whose calls waits on the network (an RBD
// image: one synchronous librbd request per call): a server runs Workers
// request workers by default, so that the loop device's queue reaches the
// backend as a queue rather than a few requests at a time.
type Parallel interface {
	Workers() int
}

// Async is an Image that starts reads and writes and reports each one's end
// to done, on a thread of its own (librbd's AIO): a server then holds no
// thread per request in flight. p must stay put until done: it must not be
// Go memory (the servers' request buffers are mapped). A start that fails
// returns its error and never calls done.
type Async interface {
	StartRead(p []byte, off int64, done func(n int, err error)) error
	StartWrite(p []byte, off int64, done func(n int, err error)) error
}

// Open opens the image spec names: rbdimage.Spec's form for an RBD image,
// else the path of an image file.
func Open(spec string, direct bool) (Image, error) {
	if access, ok := strings.CutPrefix(spec, rbdimage.Prefix); ok {
		img, err := rbdimage.Open(access)
		if err != nil {
			return nil, err
		}
		return img, nil
	}
	img, err := imagefile.Open(spec, direct)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return img, nil
}
