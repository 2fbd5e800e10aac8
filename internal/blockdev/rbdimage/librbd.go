//go:build ceph

package rbdimage

/*
#cgo LDFLAGS: -lrbd
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <rbd/librbd.h>

// berthRBDDone is Go's end of an asynchronous request (aioDone).
extern void berthRBDDone(uintptr_t handle, ssize_t ret);

// berth_rbd_cb runs on a librbd thread when a request ends: it hands the
// result to Go, then frees the completion.
static void berth_rbd_cb(rbd_completion_t c, void *arg) {
	ssize_t ret = rbd_aio_get_return_value(c);
	berthRBDDone((uintptr_t)arg, ret);
	rbd_aio_release(c);
}

// berth_rbd_aio starts a read (write == 0) or write of len bytes at off;
// handle comes back to berthRBDDone. A failure to start returns its errno
// (negative) and never calls back.
static int berth_rbd_aio(rbd_image_t img, int write, uint64_t off, size_t len, char *buf, uintptr_t handle) {
	rbd_completion_t c;
	int r = rbd_aio_create_completion((void *)handle, berth_rbd_cb, &c);
	if (r < 0) {
		return r;
	}
	r = write ? rbd_aio_write(img, off, len, buf, c) : rbd_aio_read(img, off, len, buf, c);
	if (r < 0) {
		rbd_aio_release(c);
	}
	return r;
}

// berth_rbd_break_lock_of breaks the image's exclusive lock if owner (a
// client address) holds it. -ENOENT of a lock gone meanwhile is no error.
static int berth_rbd_break_lock_of(rbd_image_t img, const char *owner) {
	rbd_lock_mode_t mode;
	char *owners[8];
	size_t n = 8;
	int r = rbd_lock_get_owners(img, &mode, owners, &n);
	if (r == -ENOENT) {
		return 0;
	}
	if (r < 0) {
		return r;
	}
	for (size_t i = 0; i < n; i++) {
		if (strcmp(owners[i], owner) != 0) {
			continue;
		}
		int b = rbd_lock_break(img, mode, owners[i]);
		if (b < 0 && b != -ENOENT && r == 0) {
			r = b;
		}
	}
	rbd_lock_get_owners_cleanup(owners, n);
	return r;
}
*/
import "C"

import (
	"fmt"
	"runtime/cgo"
	"syscall"
	"unsafe"

	"github.com/ceph/go-ceph/rados"
)

// rbdHandle is one open RBD image, with librbd's asynchronous I/O, which
// go-ceph lacks: a request in flight holds no thread, so a deep queue costs
// no thread per request. All the image's I/O goes through this one handle
// (a second handle in the same client would fight it for the exclusive
// lock).
type rbdHandle struct {
	img C.rbd_image_t
}

// rbdErr turns librbd's negative errno into an error.
func rbdErr(r C.int) error {
	if r >= 0 {
		return nil
	}
	return syscall.Errno(-r)
}

// openRBD opens image of the pool of ioctx, read-write, at its head.
func openRBD(ioctx *rados.IOContext, image string) (*rbdHandle, error) {
	name := C.CString(image)
	defer C.free(unsafe.Pointer(name))
	h := &rbdHandle{}
	if err := rbdErr(C.rbd_open(C.rados_ioctx_t(ioctx.Pointer()), name, &h.img, nil)); err != nil {
		return nil, err
	}
	return h, nil
}

func (h *rbdHandle) close() error { return rbdErr(C.rbd_close(h.img)) }

func (h *rbdHandle) size() (int64, error) {
	var size C.uint64_t
	if err := rbdErr(C.rbd_get_size(h.img, &size)); err != nil {
		return 0, err
	}
	return int64(size), nil
}

func (h *rbdHandle) resize(size int64) error { return rbdErr(C.rbd_resize(h.img, C.uint64_t(size))) }

func (h *rbdHandle) flush() error { return rbdErr(C.rbd_flush(h.img)) }

func (h *rbdHandle) discard(off, length int64) error {
	return rbdErr(C.rbd_discard(h.img, C.uint64_t(off), C.uint64_t(length)))
}

// breakLocksOf breaks the exclusive lock of any of owners.
func (h *rbdHandle) breakLocksOf(owners []string) error {
	for _, o := range owners {
		c := C.CString(o)
		err := rbdErr(C.berth_rbd_break_lock_of(h.img, c))
		C.free(unsafe.Pointer(c))
		if err != nil {
			return err
		}
	}
	return nil
}

// lockExclusive takes the exclusive lock in explicit mode (no automatic
// hand-over while held).
func (h *rbdHandle) lockExclusive() error {
	return rbdErr(C.rbd_lock_acquire(h.img, C.RBD_LOCK_MODE_EXCLUSIVE))
}

// rw reads len(p) bytes at off (returning how many it read) or writes all
// of p there, and waits for it.
func (h *rbdHandle) rw(write bool, p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	buf := (*C.char)(unsafe.Pointer(&p[0]))
	var r C.ssize_t
	if write {
		r = C.rbd_write(h.img, C.uint64_t(off), C.size_t(len(p)), buf)
	} else {
		r = C.rbd_read(h.img, C.uint64_t(off), C.size_t(len(p)), buf)
	}
	if r < 0 {
		return 0, syscall.Errno(-r)
	}
	return int(r), nil
}

// aio starts a read or write of p at off and calls done with its result
// on a librbd thread. p must not be Go memory (librbd keeps it after this
// returns): the server's request buffers are mapped memory. When the start
// fails, aio returns the error and done is never called.
func (h *rbdHandle) aio(write bool, p []byte, off int64, done func(int, error)) error {
	w := C.int(0)
	if write {
		w = 1
	}
	hd := cgo.NewHandle(done)
	r := C.berth_rbd_aio(h.img, w, C.uint64_t(off), C.size_t(len(p)), (*C.char)(unsafe.Pointer(&p[0])), C.uintptr_t(hd))
	if r < 0 {
		hd.Delete()
		return fmt.Errorf("start librbd request: %w", syscall.Errno(-r))
	}
	return nil
}

//export berthRBDDone
func berthRBDDone(handle C.uintptr_t, ret C.ssize_t) {
	hd := cgo.Handle(handle)
	done := hd.Value().(func(int, error))
	hd.Delete()
	if ret < 0 {
		done(0, syscall.Errno(-ret))
		return
	}
	done(int(ret), nil)
}
