package ublk

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/blockdev/backing"
)

// The servers' image type is a Backend that takes discards.
var (
	_ Backend   = backing.Data(nil)
	_ Discarder = backing.Data(nil)
)

// memImage is an image in memory that reports any access outside it:
// serveRequest's checks must keep every request inside the device.
type memImage struct {
	t       testing.TB
	data    []byte
	syncs   int
	modes   []uint32
	failErr error // every call fails with it when set
	noFall  bool  // Fallocate fails (EOPNOTSUPP)
}

func (m *memImage) in(off, n int64) error {
	if off < 0 || n < 0 || off+n > int64(len(m.data)) {
		m.t.Errorf("backend access at %d+%d outside the %d-byte image", off, n, len(m.data))
		return unix.EIO
	}
	return m.failErr
}

func (m *memImage) ReadAt(p []byte, off int64) (int, error) {
	if off >= int64(len(m.data)) {
		return 0, io.EOF
	}
	if err := m.in(off, min(int64(len(p)), int64(len(m.data))-off)); err != nil {
		return 0, err
	}
	n := copy(p, m.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (m *memImage) WriteAt(p []byte, off int64) (int, error) {
	if err := m.in(off, int64(len(p))); err != nil {
		return 0, err
	}
	return copy(m.data[off:], p), nil
}

func (m *memImage) Sync() error { m.syncs++; return m.failErr }

func (m *memImage) Fallocate(mode uint32, off, length int64) error {
	if err := m.in(off, length); err != nil {
		return err
	}
	if m.noFall {
		return unix.EOPNOTSUPP
	}
	m.modes = append(m.modes, mode)
	clear(m.data[off : off+length])
	return nil
}

// plainImage hides memImage's Fallocate: a backend with no discard.
type plainImage struct{ *memImage }

func (plainImage) Fallocate() {}

func TestServeRequest(t *testing.T) {
	const size, bufSize = 64 << 10, 16 << 10
	img := &memImage{t: t, data: bytes.Repeat([]byte{0xaa}, size)}
	buf := make([]byte, bufSize)
	sect := func(b int64) uint64 { return uint64(b / 512) }

	copy(buf, bytes.Repeat([]byte{1}, 4096))
	res := serveRequest(img, IODesc{OpFlags: OpWrite | IOFlagFUA, StartSector: sect(8192), NrSectors: 8}, buf, size)
	if res != 4096 || img.data[8192] != 1 || img.data[8192+4096] != 0xaa || img.syncs != 1 {
		t.Errorf("FUA write: res %d, syncs %d", res, img.syncs)
	}
	clear(buf)
	res = serveRequest(img, IODesc{OpFlags: OpRead, StartSector: sect(8192 - 512), NrSectors: 2}, buf, size)
	if res != 1024 || buf[0] != 0xaa || buf[512] != 1 {
		t.Errorf("read: res %d, data %x %x", res, buf[0], buf[512])
	}
	if res := serveRequest(img, IODesc{OpFlags: OpFlush}, buf, size); res != 0 || img.syncs != 2 {
		t.Errorf("flush: res %d, syncs %d", res, img.syncs)
	}
	// The kernel leaves a flush's sector as it finds it (the 6.12 VM
	// node's fsync failed with EIO while flushes were range-checked).
	if res := serveRequest(img, IODesc{OpFlags: OpFlush, StartSector: 1 << 40, NrSectors: 3}, buf, size); res != 0 || img.syncs != 3 {
		t.Errorf("flush with a stale sector: res %d, syncs %d", res, img.syncs)
	}
	res = serveRequest(img, IODesc{OpFlags: OpDiscard, StartSector: sect(8192), NrSectors: 8}, buf, size)
	if res != 0 || img.data[8192] != 0 || img.modes[0] != unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE {
		t.Errorf("discard: res %d, modes %v", res, img.modes)
	}
	res = serveRequest(img, IODesc{OpFlags: OpWriteZeroes | IOFlagNoUnmap, NrSectors: 8}, buf, size)
	if res != 0 || img.data[0] != 0 || img.modes[1] != unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE {
		t.Errorf("write zeroes, no unmap: res %d, modes %v", res, img.modes)
	}

	// Write-zeroes larger than the buffer, on a backend without
	// fallocate: written as zeros, in buffer-sized pieces.
	plain := plainImage{&memImage{t: t, data: bytes.Repeat([]byte{0xaa}, size)}}
	res = serveRequest(plain, IODesc{OpFlags: OpWriteZeroes, NrSectors: 40 << 10 / 512}, buf, size)
	if res != 0 || !bytes.Equal(plain.data[:40<<10], make([]byte, 40<<10)) || plain.data[40<<10] != 0xaa {
		t.Errorf("write zeroes without fallocate: res %d", res)
	}
	if res := serveRequest(plain, IODesc{OpFlags: OpDiscard, NrSectors: 8}, buf, size); res != -int32(unix.EOPNOTSUPP) {
		t.Errorf("discard without fallocate: %d, want EOPNOTSUPP", res)
	}

	// Errors: the backend's errno, EIO for one without, EIO out of range,
	// EOPNOTSUPP for an unknown operation.
	img.failErr = unix.ENOSPC
	if res := serveRequest(img, IODesc{OpFlags: OpWrite, NrSectors: 1}, buf, size); res != -int32(unix.ENOSPC) {
		t.Errorf("failed write: %d, want ENOSPC", res)
	}
	img.failErr = errors.New("connection lost")
	if res := serveRequest(img, IODesc{OpFlags: OpFlush}, buf, size); res != -int32(unix.EIO) {
		t.Errorf("failed flush: %d, want EIO", res)
	}
	img.failErr = nil
	if res := serveRequest(img, IODesc{OpFlags: OpRead, StartSector: sect(size), NrSectors: 1}, buf, size); res != -int32(unix.EIO) {
		t.Errorf("read past the end: %d, want EIO", res)
	}
	if res := serveRequest(img, IODesc{OpFlags: 15}, buf, size); res != -int32(unix.EOPNOTSUPP) {
		t.Errorf("zone reset: %d, want EOPNOTSUPP", res)
	}
}

// TestServeRequestShortImage: the image may be shorter than the device
// (it grows behind the server): reads past its end are zeros.
func TestServeRequestShortImage(t *testing.T) {
	img := &memImage{t: t, data: bytes.Repeat([]byte{7}, 1024)}
	buf := bytes.Repeat([]byte{0xff}, 4096)
	res := serveRequest(img, IODesc{OpFlags: OpRead, NrSectors: 8}, buf, 1<<20)
	if res != 4096 || buf[1023] != 7 || !bytes.Equal(buf[1024:], make([]byte, 3072)) {
		t.Errorf("read across the image's end: res %d, tail %x", res, buf[1024:1030])
	}
}

func TestNewQueueChecks(t *testing.T) {
	_, err := NewQueue(QueueConfig{Queue: 1, Info: DevInfo{NrHWQueues: 1}, Size: 100})
	if err == nil {
		t.Fatal("a queue with nothing right was accepted")
	}
	for _, want := range []string{"queue depth 0", "largest request 0", "queue 1 of a device with 1", "size 100", "no backend"} {
		if !bytes.Contains([]byte(err.Error()), []byte(want)) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if _, err := NewQueue(QueueConfig{Info: DevInfo{NrHWQueues: 1, QueueDepth: 4, MaxIOBufBytes: 64 << 10},
		Size: 1 << 20, Backend: &memImage{}}); err != nil {
		t.Errorf("a good queue: %v", err)
	}
}

// growingImage is a memImage that reports a new size once the agent grew
// it.
type growingImage struct {
	*memImage
	restats int
	err     error
}

func (g *growingImage) Restat() (int64, error) {
	g.restats++
	return int64(len(g.data)), g.err
}

// TestGrownSize: a request past the size the queue knows makes it ask the
// backend again (the device grew); one inside, or a flush, does not.
func TestGrownSize(t *testing.T) {
	const old = 64 << 10
	img := &growingImage{memImage: &memImage{t: t, data: make([]byte, old)}}
	last := IODesc{OpFlags: OpWrite, StartSector: old/512 - 8, NrSectors: 8}
	past := IODesc{OpFlags: OpWrite, StartSector: old / 512, NrSectors: 8}
	if got := grownSize(img, last, old); got != old || img.restats != 0 {
		t.Errorf("request inside: size %d after %d restats, want %d and none", got, img.restats, old)
	}
	if got := grownSize(img, IODesc{OpFlags: OpFlush, StartSector: 1 << 40}, old); got != old || img.restats != 0 {
		t.Errorf("flush: size %d after %d restats", got, img.restats)
	}
	// Not grown (a request the kernel should never send): still refused.
	if got := grownSize(img, past, old); got != old || serveRequest(img, past, make([]byte, 4096), got) >= 0 {
		t.Errorf("not grown: size %d", got)
	}
	img.data = append(img.data, make([]byte, 64<<10+100)...) // the agent grew it; not whole blocks
	got := grownSize(img, past, old)
	if got != 128<<10 {
		t.Fatalf("grown: size %d, want %d (whole 4 KiB blocks)", got, 128<<10)
	}
	if res := serveRequest(img, past, bytes.Repeat([]byte{7}, 4096), got); res != 4096 || img.data[old] != 7 {
		t.Errorf("write past the old end: res %d", res)
	}
	img.err = unix.EIO
	if got := grownSize(img, IODesc{OpFlags: OpRead, StartSector: 1 << 20, NrSectors: 8}, got); got != 128<<10 {
		t.Errorf("failed restat: size %d, want the known one", got)
	}
	if got := grownSize(plainImage{img.memImage}, past, old); got != old {
		t.Errorf("backend without Restat: size %d", got)
	}
}
