package ublk

import (
	"errors"
	"os"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// newTestRing sets up a real ring, or skips where this kernel has none.
func newTestRing(t *testing.T, entries uint32, big bool) *ring {
	t.Helper()
	r, err := newRing(entries, big)
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		t.Skipf("needs io_uring: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.close() })
	return r
}

// waitFor reaps until n completions arrived or d passed.
func waitFor(t *testing.T, r *ring, n int, d time.Duration) []cqe {
	t.Helper()
	var got []cqe
	deadline := time.Now().Add(d)
	for len(got) < n && time.Now().Before(deadline) {
		if err := r.wait(time.Until(deadline)); err != nil {
			t.Fatal(err)
		}
		got = r.reap(got)
	}
	return got
}

func TestRingNop(t *testing.T) {
	for _, big := range []bool{false, true} {
		r := newTestRing(t, 4, big)
		// More than the ring holds, in rounds: the indices wrap.
		for round := range 5 {
			for i := range 4 {
				if err := r.queue(opNop, -1, uint64(round*10+i), nil); err != nil {
					t.Fatalf("queue %d.%d: %v", round, i, err)
				}
			}
			if err := r.queue(opNop, -1, 99, nil); !errors.Is(err, errRingFull) {
				t.Fatalf("fifth entry in a ring of 4: %v, want errRingFull", err)
			}
			if err := r.submit(); err != nil {
				t.Fatal(err)
			}
			got := waitFor(t, r, 4, 5*time.Second)
			if len(got) != 4 {
				t.Fatalf("round %d: %d completions, want 4", round, len(got))
			}
			for i, c := range got {
				if c.userData != uint64(round*10+i) || c.res != 0 {
					t.Errorf("round %d: completion %d = %+v", round, i, c)
				}
			}
		}
	}
}

// TestRingURingCmd sends a real URING_CMD in a 128-byte SQE: the socket
// command SOCKET_URING_OP_SIOCINQ (Linux >= 6.7), which answers the bytes
// waiting on a UDP socket. It checks the command's placement in the SQE
// the way a ublk command would be, on a kernel without ublk.
func TestRingURingCmd(t *testing.T) {
	r := newTestRing(t, 4, true)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Sendto(fd, []byte("hello"), 0, sa); err != nil {
		t.Fatal(err)
	}
	const siocinq = 0 // SOCKET_URING_OP_SIOCINQ
	if err := r.queueCmd(fd, siocinq, nil, 7); err != nil {
		t.Fatal(err)
	}
	if err := r.submit(); err != nil {
		t.Fatal(err)
	}
	got := waitFor(t, r, 1, 5*time.Second)
	if len(got) != 1 || got[0].userData != 7 {
		t.Fatalf("completions %+v, want one for user data 7", got)
	}
	switch res := got[0].res; {
	case res == -int32(unix.EOPNOTSUPP) || res == -int32(unix.EINVAL):
		t.Skipf("this kernel has no socket URING_CMD (Linux >= 6.7): %v", unix.Errno(-res))
	case res != 5:
		t.Errorf("SIOCINQ through URING_CMD = %d, want 5", res)
	}

	// A command too big for the SQE is refused before the kernel sees it.
	if err := r.queueCmd(fd, siocinq, make([]byte, 81), 8); err == nil {
		t.Error("81 command bytes queued in a 128-byte SQE")
	}
	small := newTestRing(t, 4, false)
	if err := small.queueCmd(fd, siocinq, make([]byte, ctrlCmdSize), 8); err == nil {
		t.Error("a 32-byte control command queued in a 64-byte SQE")
	}
}

// TestRingWaitAndCancel: a wait with nothing to come returns after its
// time, and ASYNC_CANCEL ends a submission that waits in the kernel (a
// read of an empty pipe), as it ends a control command that timed out.
func TestRingWaitAndCancel(t *testing.T) {
	r := newTestRing(t, 4, true)
	start := time.Now()
	if err := r.wait(50 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 40*time.Millisecond || d > 5*time.Second {
		t.Errorf("wait(50ms) returned after %v", d)
	}

	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	buf, err := unix.Mmap(-1, 0, os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	const opRead = 22 // IORING_OP_READ
	err = r.queue(opRead, int32(p[0]), 1, func(sqe []byte) {
		le.PutUint64(sqe[16:], uint64(uintptr(unsafe.Pointer(&buf[0]))))
		le.PutUint32(sqe[24:], uint32(len(buf)))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.submit(); err != nil {
		t.Fatal(err)
	}
	if got := waitFor(t, r, 1, 50*time.Millisecond); len(got) != 0 {
		t.Fatalf("a read of an empty pipe completed: %+v", got)
	}
	if err := r.queueCancel(1, 2); err != nil {
		t.Fatal(err)
	}
	if err := r.submit(); err != nil {
		t.Fatal(err)
	}
	got := waitFor(t, r, 2, 5*time.Second)
	res := map[uint64]int32{}
	for _, c := range got {
		res[c.userData] = c.res
	}
	if res[1] != -int32(unix.ECANCELED) || res[2] != 0 || len(got) != 2 {
		t.Errorf("after the cancel: %+v, want the read ECANCELED and the cancel 0", got)
	}
}
