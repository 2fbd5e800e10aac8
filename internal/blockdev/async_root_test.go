package blockdev_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/blockdev"
	"github.com/berth-io/berth/internal/blockdev/blockdevtest"
	"github.com/berth-io/berth/internal/blockdev/imagefile"
	"github.com/berth-io/berth/internal/keeper"
)

// asyncImage is an image file with librbd's shape of I/O (backing.Async):
// each request ends on a goroutine of its own after a delay that varies,
// so requests end out of order, as librbd's do. Requests at failAt fail in
// done; requests at refuseAt are refused at the start. The real path is
// rbdimage's, tested on a real Ceph (test/userspace); this one runs
// without Ceph and can fail on purpose.
type asyncImage struct {
	*imagefile.Image
	failAt, refuseAt int64
	started, ended   atomic.Int64
	wg               sync.WaitGroup
}

var errInjected = errors.New("injected I/O error")

func (a *asyncImage) start(off int64, done func(int, error), io func() (int, error)) error {
	if off == a.refuseAt {
		return unix.EIO
	}
	n := a.started.Add(1)
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer a.ended.Add(1)
		time.Sleep(time.Duration(n%4) * time.Millisecond)
		if off == a.failAt {
			done(0, errInjected)
			return
		}
		done(io())
	}()
	return nil
}

func (a *asyncImage) StartRead(p []byte, off int64, done func(int, error)) error {
	return a.start(off, done, func() (int, error) { return a.ReadAt(p, off) })
}

func (a *asyncImage) StartWrite(p []byte, off int64, done func(int, error)) error {
	return a.start(off, done, func() (int, error) { return a.WriteAt(p, off) })
}

// A server on an asynchronous image answers each request when its I/O
// ends, in any order: parallel direct writes and reads through the FUSE
// file verify; an I/O failed in done and one refused at the start reach
// the caller as EIO; a stopping server waits for what is in flight.
func TestServeAsyncImage(t *testing.T) {
	needKernel(t)
	const size, block = 8 << 20, 64 << 10
	file, _ := blockdevtest.ImageFile(t, size, false)
	img := &asyncImage{Image: file, failAt: 5 * block, refuseAt: 9 * block}
	ioErrs, err := blockdev.OpenIOErrors(filepath.Join(t.TempDir(), "io-errors"))
	if err != nil {
		t.Fatal(err)
	}
	srv := blockdevtest.ServeWith(t, blockdev.Config{Image: img, Workers: 4, IOErrors: ioErrs})
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = (keeper.HostKernel{}).Unmount(srv.Mountpoint)
		srv.Stop()
		select {
		case err := <-srv.Done:
			if err != nil && !errors.Is(err, blockdev.ErrUnmounted) {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("server did not stop within 10s")
		}
		_ = unix.Close(srv.FD)
	}
	t.Cleanup(stop)

	f, err := os.OpenFile(filepath.Join(srv.Mountpoint, blockdev.FileName), os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// O_DIRECT wants aligned buffers: slices of one mapping are.
	mem, err := unix.Mmap(-1, 0, 2*size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Munmap(mem) }()
	want, got := mem[:size], mem[size:]
	for i := range want {
		want[i] = byte(i/block + i%251)
	}

	// Every block but the two that fail, written and read back in parallel.
	var wg sync.WaitGroup
	errs := make(chan error, 4*size/block)
	for off := int64(0); off < size; off += block {
		if off == img.failAt || off == img.refuseAt {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := f.WriteAt(want[off:off+block], off); err != nil {
				errs <- err
				return
			}
			if _, err := f.ReadAt(got[off:off+block], off); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("I/O through the async image: %v", err)
	}
	for off := int64(0); off < size; off += block {
		if off == img.failAt || off == img.refuseAt {
			continue
		}
		if !bytes.Equal(got[off:off+block], want[off:off+block]) {
			t.Fatalf("block at %d read back differs", off)
		}
	}
	onDisk := make([]byte, block)
	if _, err := img.ReadAt(onDisk, 3*block); err != nil || !bytes.Equal(onDisk, want[3*block:4*block]) {
		t.Errorf("block 3 in the image file: err %v, equal %v", err, bytes.Equal(onDisk, want[3*block:4*block]))
	}

	if n := ioErrs.Count(); n != 0 {
		t.Errorf("%d requests counted as failed before any failed", n)
	}
	for _, c := range []struct {
		name string
		off  int64
	}{{"failed in done", img.failAt}, {"refused at start", img.refuseAt}} {
		if _, err := f.WriteAt(want[:block], c.off); !errors.Is(err, unix.EIO) {
			t.Errorf("write %s: %v, want EIO", c.name, err)
		}
		if _, err := f.ReadAt(got[:block], c.off); !errors.Is(err, unix.EIO) {
			t.Errorf("read %s: %v, want EIO", c.name, err)
		}
	}

	// Two writes and two reads failed (each one request: 64 KiB).
	if n := ioErrs.Count(); n != 4 {
		t.Errorf("%d requests counted as failed, want 4", n)
	}

	_ = f.Close()
	stop()
	img.wg.Wait()
	if s, e := img.started.Load(), img.ended.Load(); s != e || s < 2*(size/block-2) {
		t.Errorf("requests started %d, ended %d: want equal and at least %d", s, e, 2*(size/block-2))
	}
}
