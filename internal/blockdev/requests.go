package blockdev

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Reading a request is where a server that dies can hurt the I/O above it.
// read(2) on /dev/fuse copies the request into the worker's buffer, pinning
// its pages; when the buffer's pages are not mapped yet (a new server's
// buffers: right after a takeover) the kernel's page pinning gives up on a
// pending SIGKILL, and the kernel then ends that request with EIO instead of
// keeping it for the next server. For a WRITE that is an I/O error on the
// loop device and an aborted ext4 journal (seen here: 1 run in 3 of the
// 50-cycle heal test on Ceph, whose servers run 64 workers).
//
// splice(2) from /dev/fuse into a pipe hands the request over inside the
// kernel (WRITE data by page reference, no copy), so no fatal signal can
// fail it; a request spliced by a server that then dies is one it took and
// never answered, which the next server gets again (FUSE_NOTIFY_RESEND).
// The worker then reads the pipe into its buffer: one copy, as before.

// pipeSize holds the largest request of a connection whose max write is w:
// the WRITE's pages and a page of headers, and a page more for data that
// does not start on a page (the kernel rounds up to a power of two).
func pipeSize(w uint32) int { return int(w) + 2*pageSize }

// requestPipe is a worker's pipe for splice; the zero value (fds -1 via
// noPipe) reads /dev/fuse directly.
type requestPipe struct {
	r, w int
}

var noPipe = requestPipe{r: -1, w: -1}

// newRequestPipe makes a pipe large enough for any request of a connection
// whose max write is w. A pipe beyond /proc/sys/fs/pipe-max-size (1 MiB by
// default, enough for initMaxWrite) needs CAP_SYS_RESOURCE; a connection
// an older server negotiated with 1 MiB writes may need it: without it the
// error says so and the worker reads directly.
func newRequestPipe(w uint32) (requestPipe, error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		return noPipe, fmt.Errorf("pipe for requests: %w", err)
	}
	p := requestPipe{r: fds[0], w: fds[1]}
	size := pipeSize(w)
	got, err := unix.FcntlInt(uintptr(p.w), unix.F_SETPIPE_SZ, size)
	if err == nil && got < size {
		err = fmt.Errorf("got %d bytes", got)
	}
	if err != nil {
		p.close()
		return noPipe, fmt.Errorf("grow the request pipe to %d bytes for writes of %d (needs CAP_SYS_RESOURCE above fs.pipe-max-size): %w", size, w, err)
	}
	return p, nil
}

func (p requestPipe) close() {
	if p.r >= 0 {
		_ = unix.Close(p.r)
		_ = unix.Close(p.w)
	}
}

// errPipe marks a failure after the request left /dev/fuse: never one of
// the errnos the worker loop retries on, as the request is taken.
var errPipe = errors.New("read request from its pipe")

// readRequest reads one request from dev into buf and returns its length.
func (p requestPipe) readRequest(dev int, buf []byte) (int, error) {
	if p.r < 0 {
		return unix.Read(dev, buf)
	}
	n64, err := unix.Splice(dev, nil, p.w, nil, len(buf), 0)
	if err != nil {
		return 0, err
	}
	n := int(n64)
	for got := 0; got < n; {
		m, err := unix.Read(p.r, buf[got:n])
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return 0, fmt.Errorf("%w: %v", errPipe, err)
		case m == 0:
			return 0, fmt.Errorf("%w: %d of %d bytes", errPipe, got, n)
		}
		got += m
	}
	return n, nil
}
