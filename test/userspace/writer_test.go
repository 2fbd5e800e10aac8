package userspace

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	blockSize  = 4096
	fileBlocks = 8192 // 32 MiB
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// writer writes checksummed 4 KiB blocks with O_DIRECT at random offsets of
// one file, fdatasyncs each, reads back a written block every few writes
// and checks its checksum and sequence number. Any error is counted.
type writer struct {
	path string
	f    *os.File
	buf  []byte // aligned for O_DIRECT
	// seq[i] is the sequence number last written to block i (0: never).
	seq  []uint64
	next uint64
	rnd  *rand.Rand

	mu       sync.Mutex
	errs     []error
	writes   atomic.Int64
	verified atomic.Int64
	// lastOK is the UnixNano when the latest write+fdatasync finished.
	lastOK atomic.Int64
	// mark and resumed: resumed is when the first write+fdatasync that
	// finished after mark did (both UnixNano); the heal tests set mark at
	// the agent's start to time each volume's own recovery.
	mark, resumed atomic.Int64

	stop     chan struct{}
	haltOnce sync.Once
	done     chan struct{}
}

func alignedBlock() []byte {
	b := make([]byte, 2*blockSize)
	off := 0
	if r := int(uintptr(unsafe.Pointer(&b[0])) % blockSize); r != 0 {
		off = blockSize - r
	}
	return b[off : off+blockSize]
}

func newWriter(path string, seed uint64) (*writer, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|unix.O_DIRECT, 0o600)
	if err != nil {
		return nil, err
	}
	return &writer{path: path, f: f, buf: alignedBlock(), seq: make([]uint64, fileBlocks),
		rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// fill makes the content of block idx at sequence seq.
func fill(b []byte, idx int, seq uint64) {
	binary.LittleEndian.PutUint64(b[0:], seq)
	binary.LittleEndian.PutUint32(b[8:], uint32(idx))
	x := seq*0x2545f4914f6cdd1d + uint64(idx)
	for i := 12; i+8 <= blockSize-4; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	binary.LittleEndian.PutUint32(b[blockSize-4:], crc32.Checksum(b[:blockSize-4], castagnoli))
}

func (w *writer) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.errs = append(w.errs, err)
}

// Errors returns the errors seen so far.
func (w *writer) Errors() []error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]error(nil), w.errs...)
}

// resumedAfter is when the first write that finished after mark did (0:
// none yet); Mark sets mark.
func (w *writer) resumedAfter(mark int64) int64 {
	if r := w.resumed.Load(); r >= mark {
		return r
	}
	return 0
}

// Mark starts timing the next write to finish.
func (w *writer) Mark(t time.Time) { w.mark.Store(t.UnixNano()) }

func (w *writer) run() {
	defer close(w.done)
	for {
		select {
		case <-w.stop:
			return
		default:
		}
		idx := w.rnd.IntN(fileBlocks)
		w.next++
		fill(w.buf, idx, w.next)
		if _, err := w.f.WriteAt(w.buf, int64(idx)*blockSize); err != nil {
			w.fail(fmt.Errorf("write block %d: %w", idx, err))
			return
		}
		if err := unix.Fdatasync(int(w.f.Fd())); err != nil {
			w.fail(fmt.Errorf("fdatasync after block %d: %w", idx, err))
			return
		}
		w.seq[idx] = w.next
		w.writes.Add(1)
		now := time.Now().UnixNano()
		w.lastOK.Store(now)
		if r := w.resumed.Load(); r < w.mark.Load() {
			w.resumed.CompareAndSwap(r, now)
		}
		if w.next%4 == 0 {
			if err := w.check(w.rnd.IntN(fileBlocks)); err != nil {
				w.fail(err)
				return
			}
		}
	}
}

// check reads block idx from the device (O_DIRECT) and verifies it.
func (w *writer) check(idx int) error {
	want := w.seq[idx]
	if want == 0 {
		return nil
	}
	if _, err := w.f.ReadAt(w.buf, int64(idx)*blockSize); err != nil {
		return fmt.Errorf("read block %d: %w", idx, err)
	}
	if got := crc32.Checksum(w.buf[:blockSize-4], castagnoli); got != binary.LittleEndian.Uint32(w.buf[blockSize-4:]) {
		return fmt.Errorf("block %d: checksum mismatch", idx)
	}
	if got := binary.LittleEndian.Uint64(w.buf); got != want || binary.LittleEndian.Uint32(w.buf[8:]) != uint32(idx) {
		return fmt.Errorf("block %d: holds sequence %d, want %d", idx, got, want)
	}
	w.verified.Add(1)
	return nil
}

// Stop ends the writes, verifies every written block and closes the file.
func (w *writer) Stop(timeout time.Duration) error {
	w.halt()
	select {
	case <-w.done:
	case <-time.After(timeout):
		return errors.New("writer stuck (I/O does not finish)")
	}
	defer func() { _ = w.f.Close() }()
	for i := range w.seq {
		if err := w.check(i); err != nil {
			w.fail(err)
		}
	}
	return errors.Join(w.Errors()...)
}

// halt asks the writer to stop after the write in hand, without waiting.
func (w *writer) halt() { w.haltOnce.Do(func() { close(w.stop) }) }

// startWriter starts a verifying writer on a file in m; seed picks its data.
func startWriter(t *testing.T, m mounted, seed uint64) *writer {
	t.Helper()
	w, err := newWriter(filepath.Join(m.target, "data"), seed)
	if err != nil {
		t.Fatal(err)
	}
	go w.run()
	return w
}

// waitWrite waits until a write finished after since; it fails the test
// when none did within limit.
func (w *writer) waitWrite(t *testing.T, since time.Time, limit time.Duration) {
	t.Helper()
	for w.lastOK.Load() < since.UnixNano() {
		if time.Since(since) > limit {
			t.Fatalf("no write finished within %s (errors: %v)", limit, w.Errors())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
