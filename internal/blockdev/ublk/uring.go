package ublk

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The few io_uring operations ublk needs (include/uapi/linux/io_uring.h):
// set up a ring with 128-byte SQEs, queue URING_CMD (and NOP, ASYNC_CANCEL)
// submissions, and reap completions with a timeout. A ring is used by one
// goroutine at a time; ublk's I/O commands must moreover be issued from
// one OS thread per queue (the caller locks it).

const (
	setupSQE128 = 1 << 10 // IORING_SETUP_SQE128
	setupCQSize = 1 << 3  // IORING_SETUP_CQSIZE

	featSingleMmap = 1 << 0 // IORING_FEAT_SINGLE_MMAP
	featExtArg     = 1 << 8 // IORING_FEAT_EXT_ARG: a timeout in io_uring_enter

	enterGetEvents = 1 << 0 // IORING_ENTER_GETEVENTS
	enterExtArg    = 1 << 3 // IORING_ENTER_EXT_ARG

	offSQRing = 0          // IORING_OFF_SQ_RING
	offCQRing = 0x8000000  // IORING_OFF_CQ_RING
	offSQEs   = 0x10000000 // IORING_OFF_SQES

	opNop         = 0  // IORING_OP_NOP
	opAsyncCancel = 14 // IORING_OP_ASYNC_CANCEL
	opURingCmd    = 46 // IORING_OP_URING_CMD

	sqeSize     = 64
	cqeSize     = 16
	paramsBytes = 120 // struct io_uring_params

	// sqeCmdOff: where a URING_CMD's command bytes start in its SQE
	// (sqe->cmd, over addr3): 16 bytes in a 64-byte SQE, 80 in a 128-byte one.
	sqeCmdOff = 48
)

// uringParams is struct io_uring_params.
type uringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFD uint32
	resv                                                                   [3]uint32
	sqOff                                                                  sqringOffsets
	cqOff                                                                  cqringOffsets
}

// sqringOffsets is struct io_sqring_offsets.
type sqringOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

// cqringOffsets is struct io_cqring_offsets.
type cqringOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

// getEventsArg is struct io_uring_getevents_arg (IORING_ENTER_EXT_ARG).
type getEventsArg struct {
	sigmask   uint64
	sigmaskSz uint32
	minWait   uint32 // pad before 6.12
	ts        uint64 // pointer to a struct __kernel_timespec
}

// cqe is one completion: the submission's user data and its result
// (a negative errno on failure).
type cqe struct {
	userData uint64
	res      int32
	flags    uint32
}

// ring is one io_uring instance.
type ring struct {
	fd      int
	sqeLen  int // 64 or 128
	sqRing  []byte
	cqRing  []byte // == sqRing with IORING_FEAT_SINGLE_MMAP
	sqes    []byte
	sqHead  *uint32
	sqTail  *uint32
	sqMask  uint32
	sqArray []uint32
	cqHead  *uint32
	cqTail  *uint32
	cqMask  uint32
	cqes    []byte
	pending uint32 // queued SQEs not yet passed to io_uring_enter
	single  bool   // one mapping holds both rings
	ts      unix.Timespec
	arg     getEventsArg
}

// errRingFull: no free SQE; submit (and reap) first.
var errRingFull = errors.New("io_uring: submission queue full")

// newRing sets up a ring of entries SQEs (a power of two; the kernel rounds
// up), with 128-byte SQEs when big, and twice as many CQEs.
func newRing(entries uint32, big bool) (*ring, error) {
	p := uringParams{}
	if big {
		p.flags |= setupSQE128
	}
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		switch errno {
		case unix.ENOSYS:
			return nil, fmt.Errorf("io_uring_setup: %w: the kernel has no io_uring (CONFIG_IO_URING)", errno)
		case unix.EPERM:
			return nil, fmt.Errorf("io_uring_setup: %w: io_uring is disabled (sysctl kernel.io_uring_disabled)", errno)
		case unix.EINVAL:
			if big {
				return nil, fmt.Errorf("io_uring_setup: %w: the kernel has no IORING_SETUP_SQE128 (Linux >= 5.19)", errno)
			}
		}
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r := &ring{fd: int(fd), sqeLen: sqeSize}
	if big {
		r.sqeLen = 2 * sqeSize
	}
	if err := r.mmap(&p); err != nil {
		r.close()
		return nil, err
	}
	if p.features&featExtArg == 0 {
		r.close()
		return nil, errors.New("io_uring: the kernel has no IORING_FEAT_EXT_ARG (Linux >= 5.11): no timed wait")
	}
	return r, nil
}

func (r *ring) mmap(p *uringParams) error {
	sqSize := int(p.sqOff.array) + int(p.sqEntries)*4
	cqSize := int(p.cqOff.cqes) + int(p.cqEntries)*cqeSize
	r.single = p.features&featSingleMmap != 0
	if r.single {
		sqSize = max(sqSize, cqSize)
	}
	var err error
	prot, flags := unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE
	if r.sqRing, err = unix.Mmap(r.fd, offSQRing, sqSize, prot, flags); err != nil {
		return fmt.Errorf("io_uring: mmap of the SQ ring: %w", err)
	}
	r.cqRing = r.sqRing
	if !r.single {
		if r.cqRing, err = unix.Mmap(r.fd, offCQRing, cqSize, prot, flags); err != nil {
			return fmt.Errorf("io_uring: mmap of the CQ ring: %w", err)
		}
	}
	if r.sqes, err = unix.Mmap(r.fd, offSQEs, int(p.sqEntries)*r.sqeLen, prot, flags); err != nil {
		return fmt.Errorf("io_uring: mmap of the SQEs: %w", err)
	}
	r.sqHead = u32At(r.sqRing, p.sqOff.head)
	r.sqTail = u32At(r.sqRing, p.sqOff.tail)
	r.sqMask = *u32At(r.sqRing, p.sqOff.ringMask)
	r.sqArray = unsafe.Slice(u32At(r.sqRing, p.sqOff.array), p.sqEntries)
	r.cqHead = u32At(r.cqRing, p.cqOff.head)
	r.cqTail = u32At(r.cqRing, p.cqOff.tail)
	r.cqMask = *u32At(r.cqRing, p.cqOff.ringMask)
	r.cqes = r.cqRing[p.cqOff.cqes : int(p.cqOff.cqes)+int(p.cqEntries)*cqeSize]
	return nil
}

func u32At(b []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&b[off])) }

// close releases the ring. The kernel cancels whatever is still in flight
// on it (ublk: the fetches of a queue, which is what a server's death does).
func (r *ring) close() error {
	maps := [][]byte{r.sqes, r.sqRing}
	if !r.single {
		maps = append(maps, r.cqRing)
	}
	for _, m := range maps {
		if m != nil {
			_ = unix.Munmap(m)
		}
	}
	r.sqes, r.cqRing, r.sqRing = nil, nil, nil
	if r.fd < 0 {
		return nil
	}
	err := unix.Close(r.fd)
	r.fd = -1
	return err
}

// queue fills the next free SQE: opcode op on fd, user data ud; fill, if
// not nil, sets the rest of the entry (its len(sqe) is 64 or 128, zeroed).
func (r *ring) queue(op uint8, fd int32, ud uint64, fill func(sqe []byte)) error {
	tail := *r.sqTail + r.pending
	if tail-atomic.LoadUint32(r.sqHead) > r.sqMask {
		return errRingFull
	}
	i := tail & r.sqMask
	sqe := r.sqes[int(i)*r.sqeLen : int(i+1)*r.sqeLen]
	clear(sqe)
	sqe[0] = op
	le.PutUint32(sqe[4:], uint32(fd))
	le.PutUint64(sqe[32:], ud)
	if fill != nil {
		fill(sqe)
	}
	r.sqArray[i] = i
	r.pending++
	return nil
}

// queueCmd queues a URING_CMD: cmdOp on fd with cmd as its command bytes.
func (r *ring) queueCmd(fd int, cmdOp uint32, cmd []byte, ud uint64) error {
	if len(cmd) > r.sqeLen-sqeCmdOff {
		return fmt.Errorf("io_uring: %d command bytes do not fit a %d-byte SQE", len(cmd), r.sqeLen)
	}
	return r.queue(opURingCmd, int32(fd), ud, func(sqe []byte) {
		le.PutUint32(sqe[8:], cmdOp)
		copy(sqe[sqeCmdOff:], cmd)
	})
}

// queueCancel queues an ASYNC_CANCEL of the submission with user data
// target (it interrupts a command that waits in the kernel).
func (r *ring) queueCancel(target, ud uint64) error {
	return r.queue(opAsyncCancel, -1, ud, func(sqe []byte) {
		le.PutUint64(sqe[16:], target)
	})
}

// submit passes the queued SQEs to the kernel.
func (r *ring) submit() error {
	n := r.pending
	if n == 0 {
		return nil
	}
	atomic.StoreUint32(r.sqTail, *r.sqTail+n) // the release that publishes the SQEs
	r.pending = 0
	for n > 0 {
		got, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(n), 0, 0, 0, 0)
		switch errno {
		case 0:
			n -= uint32(got)
		case unix.EINTR:
		default:
			return fmt.Errorf("io_uring_enter: %w", errno)
		}
	}
	return nil
}

// wait waits up to d for at least one completion to arrive. Running out of
// time is no error: reap then finds nothing.
func (r *ring) wait(d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		if atomic.LoadUint32(r.cqTail) != *r.cqHead {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil
		}
		// The argument lives in the ring (heap memory, which never moves)
		// because the kernel reads it through a pointer inside it.
		r.ts = unix.NsecToTimespec(left.Nanoseconds())
		r.arg = getEventsArg{ts: uint64(uintptr(unsafe.Pointer(&r.ts)))}
		_, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), 0, 1,
			enterGetEvents|enterExtArg, uintptr(unsafe.Pointer(&r.arg)), unsafe.Sizeof(r.arg))
		switch errno {
		case 0, unix.ETIME:
			// ETIME: the time ran out; 0: something arrived (checked above).
		case unix.EINTR:
			// The Go runtime's signals (preemption) interrupt the wait.
		default:
			return fmt.Errorf("io_uring_enter: %w", errno)
		}
	}
}

// reap returns the completions that have arrived, without waiting.
func (r *ring) reap(out []cqe) []cqe {
	head := *r.cqHead
	tail := atomic.LoadUint32(r.cqTail) // the acquire that pairs with the kernel's write
	for ; head != tail; head++ {
		b := r.cqes[int(head&r.cqMask)*cqeSize:]
		out = append(out, cqe{userData: le.Uint64(b[0:]), res: int32(le.Uint32(b[8:])), flags: le.Uint32(b[12:])})
	}
	atomic.StoreUint32(r.cqHead, head)
	return out
}
