package nbd

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/blockdev/blockdevtest"
)

func mustDo(t testing.TB, c *testClient, cmd, flags uint16, off uint64, length uint32, data []byte) []byte {
	t.Helper()
	errno, got, err := c.do(cmd, flags, off, length, data)
	if err != nil {
		t.Fatalf("cmd %d at %d+%d: %v", cmd, off, length, err)
	}
	if errno != 0 {
		t.Fatalf("cmd %d at %d+%d: errno %d", cmd, off, length, errno)
	}
	return got
}

// Concurrent random writes and reads from several goroutines on a real
// image; each goroutine owns every g-th 64 KiB stripe, so its model of its
// stripes is exact. At the end the file itself must match the model.
func TestServeConcurrentReadWrite(t *testing.T) {
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			const size, stripe, goroutines, ops = 8 << 20, 64 << 10, 8, 150
			img, path := blockdevtest.ImageFile(t, size, direct)
			s := startServe(t, img, 8)
			model := make([]byte, size)
			var wg sync.WaitGroup
			errs := make(chan error, goroutines)
			for g := range goroutines {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(g), 7))
					for range ops {
						st := int64(rng.IntN(size/stripe/goroutines)*goroutines+g) * stripe
						// Aligned and unaligned ranges inside the stripe.
						off := st + rng.Int64N(stripe/2)
						if rng.IntN(2) == 0 {
							off &^= 4095
						}
						n := 1 + rng.Int64N(st+stripe-off)
						if rng.IntN(3) == 0 {
							buf := make([]byte, n)
							for i := range buf {
								buf[i] = byte(rng.Uint32())
							}
							flags := uint16(0)
							if rng.IntN(4) == 0 {
								flags = cmdFlagFUA
							}
							if errno, _, err := s.client.do(cmdWrite, flags, uint64(off), uint32(n), buf); err != nil || errno != 0 {
								errs <- fmt.Errorf("write %d+%d: errno %d, %w", off, n, errno, err)
								return
							}
							copy(model[off:], buf)
							continue
						}
						errno, got, err := s.client.do(cmdRead, 0, uint64(off), uint32(n), nil)
						if err != nil || errno != 0 {
							errs <- fmt.Errorf("read %d+%d: errno %d, %w", off, n, errno, err)
							return
						}
						if sha256.Sum256(got) != sha256.Sum256(model[off:off+n]) {
							errs <- fmt.Errorf("read %d+%d: data differs from what was written", off, n)
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			mustDo(t, s.client, cmdFlush, 0, 0, 0, nil)
			onDisk, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if sha256.Sum256(onDisk) != sha256.Sum256(model) {
				t.Fatal("image file differs from the writes")
			}
		})
	}
}

func TestServeFlushAndFUAReachSync(t *testing.T) {
	m := newMemBackend(1 << 20)
	s := startServe(t, m, 4)
	data := bytes.Repeat([]byte{1}, 4096)
	steps := []struct {
		name        string
		cmd, flags  uint16
		data        []byte
		wantSyncs   int32
		off, length uint32
	}{
		{"write", cmdWrite, 0, data, 0, 0, 4096},
		{"write+FUA", cmdWrite, cmdFlagFUA, data, 1, 0, 4096},
		{"flush", cmdFlush, 0, nil, 2, 0, 0},
		{"flush+FUA", cmdFlush, cmdFlagFUA, nil, 3, 0, 0},
		{"write zeroes+FUA", cmdWriteZeroes, cmdFlagFUA, nil, 4, 0, 4096},
		{"trim+FUA", cmdTrim, cmdFlagFUA, nil, 5, 0, 4096},
		{"read", cmdRead, 0, nil, 5, 0, 4096},
	}
	for _, st := range steps {
		mustDo(t, s.client, st.cmd, st.flags, uint64(st.off), st.length, st.data)
		if got := m.syncs.Load(); got != st.wantSyncs {
			t.Fatalf("after %s: %d syncs, want %d", st.name, got, st.wantSyncs)
		}
	}
}

func blocks(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks
}

// fill writes non-zero data over the whole image through the server.
func fill(t *testing.T, c *testClient, size int) {
	t.Helper()
	mustDo(t, c, cmdWrite, cmdFlagFUA, 0, uint32(size), bytes.Repeat([]byte{0xab}, size))
}

func TestServeTrimPunchesHole(t *testing.T) {
	const size, off, n = 4 << 20, 1 << 20, 1 << 20
	img, path := blockdevtest.ImageFile(t, size, false)
	s := startServe(t, img, 4)
	fill(t, s.client, size)
	before := blocks(t, path)
	mustDo(t, s.client, cmdTrim, 0, off, n, nil)
	after := blocks(t, path)
	if before-after != n/512 {
		t.Fatalf("trim of %d bytes freed %d blocks of 512 (from %d to %d), want %d", n, before-after, before, after, n/512)
	}
	got := mustDo(t, s.client, cmdRead, 0, off, n, nil)
	if !bytes.Equal(got, make([]byte, n)) {
		t.Fatal("trimmed range does not read as zeros")
	}
	if got := mustDo(t, s.client, cmdRead, 0, 0, 4096, nil); got[0] != 0xab {
		t.Fatal("data before the trimmed range is gone")
	}
	// Empty ranges are no-ops, not fallocate's EINVAL.
	mustDo(t, s.client, cmdTrim, 0, 4096, 0, nil)
	mustDo(t, s.client, cmdWriteZeroes, 0, 4096, 0, nil)
}

func TestServeWriteZeroes(t *testing.T) {
	const size, n = 4 << 20, 1 << 20
	img, path := blockdevtest.ImageFile(t, size, false)
	s := startServe(t, img, 4)
	fill(t, s.client, size)
	before := blocks(t, path)

	mustDo(t, s.client, cmdWriteZeroes, 0, 0, n, nil)
	if freed := before - blocks(t, path); freed != n/512 {
		t.Fatalf("write zeroes (holes allowed) freed %d blocks, want %d", freed, n/512)
	}
	// NO_HOLE: zeros, space stays allocated.
	mustDo(t, s.client, cmdWriteZeroes, cmdFlagNoHole, 2*n, n, nil)
	if freed := before - blocks(t, path); freed != n/512 {
		t.Fatalf("write zeroes with NO_HOLE changed allocation: %d blocks freed in all, want %d", freed, n/512)
	}
	for _, off := range []uint64{0, 2 * n} {
		if got := mustDo(t, s.client, cmdRead, 0, off, n, nil); !bytes.Equal(got, make([]byte, n)) {
			t.Fatalf("zeroed range at %d does not read as zeros", off)
		}
	}
	if got := mustDo(t, s.client, cmdRead, 0, n, 4096, nil); got[0] != 0xab {
		t.Fatal("data between the zeroed ranges is gone")
	}
}

// Without fallocate support, WRITE_ZEROES writes zeros and TRIM succeeds.
func TestServeZeroesWithoutFallocate(t *testing.T) {
	m := newMemBackend(3 << 20)
	m.noFalloc = true
	s := startServe(t, m, 2)
	fill(t, s.client, 3<<20)
	mustDo(t, s.client, cmdWriteZeroes, 0, 4096, 2<<20, nil)
	mustDo(t, s.client, cmdTrim, 0, 0, 4096, nil)
	got := mustDo(t, s.client, cmdRead, 0, 0, 3<<20, nil)
	if got[0] != 0xab || !bytes.Equal(got[4096:4096+2<<20], make([]byte, 2<<20)) || got[4096+2<<20] != 0xab {
		t.Fatal("write zeroes by writing: wrong data")
	}
}

func TestServeInvalidRequestsGetProtocolErrors(t *testing.T) {
	const size = 1 << 20
	s := startServe(t, newMemBackend(size), 2)
	cases := []struct {
		name        string
		cmd         uint16
		flags       uint16
		off         uint64
		length      uint32
		data        []byte
		wantErrno   uint32
		wantServing bool
	}{
		{"read past end", cmdRead, 0, size - 512, 1024, nil, errnoInval, true},
		// proto.md: ENOSPC for a write past the end, EINVAL for a read or trim.
		{"write past end", cmdWrite, 0, size, 512, make([]byte, 512), errnoNoSpc, true},
		{"trim past end", cmdTrim, 0, size, 4096, nil, errnoInval, true},
		{"write zeroes past end", cmdWriteZeroes, 0, size - 1, 2, nil, errnoNoSpc, true},
		{"offset overflow", cmdRead, 0, ^uint64(0) - 10, 512, nil, errnoInval, true},
		{"write offset overflow", cmdWrite, 0, ^uint64(0) - 10, 512, make([]byte, 512), errnoNoSpc, true},
		{"read too large", cmdRead, 0, 0, maxPayload + 1, nil, errnoInval, true},
		{"cache (not offered)", cmdCache, 0, 0, 4096, nil, errnoInval, true},
		{"unknown command", 99, 0, 0, 0, nil, errnoInval, true},
		// Flags a command does not take: EINVAL, nothing done.
		{"unknown flag", cmdWrite, 1 << 5, 0, 512, make([]byte, 512), errnoInval, true},
		{"no-hole on trim", cmdTrim, cmdFlagNoHole, 0, 4096, nil, errnoInval, true},
		{"no-hole on write", cmdWrite, cmdFlagNoHole, 0, 512, make([]byte, 512), errnoInval, true},
	}
	for _, c := range cases {
		errno, _, err := s.client.do(c.cmd, c.flags, c.off, c.length, c.data)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if errno != c.wantErrno {
			t.Fatalf("%s: errno %d, want %d", c.name, errno, c.wantErrno)
		}
		// Still serving, stream still in step.
		mustDo(t, s.client, cmdWrite, 0, 0, 512, bytes.Repeat([]byte{7}, 512))
		if got := mustDo(t, s.client, cmdRead, 0, 0, 512, nil); got[511] != 7 {
			t.Fatalf("after %s: read back wrong data", c.name)
		}
	}
}

// alignCheck records whether every read buffer was 4096-aligned: the image
// uses O_DIRECT only for aligned memory.
type alignCheck struct {
	*memBackend
	unaligned atomic.Int32
}

func (a *alignCheck) ReadAt(p []byte, off int64) (int, error) {
	if uintptr(unsafe.Pointer(&p[0]))%4096 != 0 {
		a.unaligned.Add(1)
	}
	return a.memBackend.ReadAt(p, off)
}

func TestServeReadsIntoAlignedMemory(t *testing.T) {
	b := &alignCheck{memBackend: newMemBackend(64 << 20)}
	s := startServe(t, b, 4)
	want := bytes.Repeat([]byte{9}, 4096)
	mustDo(t, s.client, cmdWrite, 0, 8192, 4096, want)
	for _, n := range []uint32{512, 4096, 1 << 20, maxPayload} {
		got := mustDo(t, s.client, cmdRead, 0, 0, n, nil)
		if n >= 12288 && !bytes.Equal(got[8192:12288], want) {
			t.Fatalf("read of %d bytes: wrong data", n)
		}
	}
	if n := b.unaligned.Load(); n != 0 {
		t.Fatalf("%d reads into memory that is not page aligned", n)
	}
}

// A request with a flag its command does not take changes nothing.
func TestServeRejectedFlagWritesNothing(t *testing.T) {
	m := newMemBackend(1 << 20)
	s := startServe(t, m, 2)
	mustDo(t, s.client, cmdWrite, 0, 0, 4096, bytes.Repeat([]byte{1}, 4096))
	for _, c := range []struct {
		cmd, flags uint16
		data       []byte
	}{
		{cmdWrite, 1 << 7, bytes.Repeat([]byte{2}, 4096)},
		{cmdTrim, cmdFlagNoHole, nil},
		{cmdWriteZeroes, 1 << 2, nil},
	} {
		errno, _, err := s.client.do(c.cmd, c.flags, 0, 4096, c.data)
		if err != nil || errno != errnoInval {
			t.Fatalf("cmd %d flags %#x: errno %d (%v), want EINVAL", c.cmd, c.flags, errno, err)
		}
	}
	if got := mustDo(t, s.client, cmdRead, 0, 0, 4096, nil); !bytes.Equal(got, bytes.Repeat([]byte{1}, 4096)) {
		t.Fatal("a rejected request changed the image")
	}
}

// TestServeBackendErrors: a backend error reaches the kernel as its NBD
// errno, and each is counted as a failed request; a success, and a request
// refused before the backend (EINVAL), are not.
func TestServeBackendErrors(t *testing.T) {
	m := newMemBackend(1 << 20)
	var failed atomic.Int32
	s := startServeCounting(t, m, 2, func() { failed.Add(1) })
	for _, c := range []struct {
		err   error
		errno uint32
	}{
		{fmt.Errorf("write image: %w", unix.ENOSPC), errnoNoSpc},
		{fmt.Errorf("write image: %w", unix.EDQUOT), errnoNoSpc},
		{fmt.Errorf("write image: %w", unix.EFBIG), errnoNoSpc},
		{fmt.Errorf("write image: %w", unix.EIO), errnoIO},
		{errors.New("anything else"), errnoIO},
	} {
		m.writeErr = c.err
		errno, _, err := s.client.do(cmdWrite, 0, 0, 512, make([]byte, 512))
		if err != nil || errno != c.errno {
			t.Fatalf("backend error %v: errno %d (%v), want %d", c.err, errno, err, c.errno)
		}
	}
	m.writeErr = nil
	mustDo(t, s.client, cmdWrite, 0, 0, 512, make([]byte, 512))
	if errno, _, err := s.client.do(cmdWrite, 0, 1<<20, 512, make([]byte, 512)); err != nil || errno == errnoOK {
		t.Fatalf("write past the end: errno %d (%v), want refused", errno, err)
	}
	if n := failed.Load(); n != 5 {
		t.Errorf("%d requests counted as failed, want the backend's 5", n)
	}
}

func TestServeBadMagicEndsServe(t *testing.T) {
	s := startServe(t, newMemBackend(1<<20), 2)
	bad := make([]byte, requestSize)
	putRequest(bad, request{cmd: cmdRead, length: 512})
	bad[0] ^= 0xff
	if err := s.client.sendRaw(bad); err != nil {
		t.Fatal(err)
	}
	if err := s.wait(t); !errors.Is(err, errBadMagic) {
		t.Fatalf("Serve returned %v, want bad magic", err)
	}
}

// NBD_CMD_DISC: requests already read finish and are answered before Serve
// returns nil.
func TestServeDiscDrainsInFlight(t *testing.T) {
	m := newMemBackend(1 << 20)
	m.hold = make(chan struct{})
	m.started = make(chan struct{}, 4)
	s := startServe(t, m, 4)
	var calls []*call
	for i := range 4 {
		cl, err := s.client.start(cmdWrite, 0, uint64(i)*4096, 4096, bytes.Repeat([]byte{byte(i + 1)}, 4096))
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, cl)
	}
	for range 4 {
		<-m.started
	}
	disc := make([]byte, requestSize)
	putRequest(disc, request{cmd: cmdDisc, cookie: 1 << 40})
	if err := s.client.sendRaw(disc); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-s.result:
		t.Fatalf("Serve returned (%v) with 4 writes in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(m.hold)
	if err := s.wait(t); err != nil {
		t.Fatalf("Serve after DISC: %v", err)
	}
	for i, cl := range calls {
		<-cl.done
		if cl.errno != 0 {
			t.Fatalf("write %d: errno %d", i, cl.errno)
		}
		if m.data[i*4096] != byte(i+1) {
			t.Fatalf("write %d did not reach the backend", i)
		}
	}
}

func TestServePeerCloseIsErrDisconnected(t *testing.T) {
	s := startServe(t, newMemBackend(1<<20), 2)
	mustDo(t, s.client, cmdRead, 0, 0, 512, nil)
	_ = s.client.conn.Close()
	if err := s.wait(t); !errors.Is(err, ErrDisconnected) {
		t.Fatalf("Serve returned %v, want ErrDisconnected", err)
	}
}

func TestServeContextEnds(t *testing.T) {
	s := startServe(t, newMemBackend(1<<20), 2)
	mustDo(t, s.client, cmdRead, 0, 0, 512, nil)
	s.cancel()
	select {
	case err := <-s.result:
		s.result <- err
		if errors.Is(err, ErrDisconnected) || err == nil {
			t.Fatalf("Serve returned %v, want the context's error", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
}
