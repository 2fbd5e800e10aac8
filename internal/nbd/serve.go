package nbd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/blockdev/backing"
)

// Backend is what Serve serves: an image's content.
type Backend = backing.Data

// ErrDisconnected wraps Serve's error when the peer closed the connection.
var ErrDisconnected = errors.New("nbd: connection closed by peer")

// DefaultWorkers is the request concurrency per connection when Serve gets 0.
const DefaultWorkers = 16

// errDisc ends the read loop on NBD_CMD_DISC.
var errDisc = errors.New("nbd: disconnect requested")

// readDeadliner is what lets ctx interrupt a blocked read: a non-blocking
// *os.File (socketpair end) or a net.Conn.
type readDeadliner interface {
	SetReadDeadline(t time.Time) error
}

// Serve speaks the NBD transmission phase on conn until the peer sends
// NBD_CMD_DISC (in-flight requests drain, then nil), the connection closes
// (an error wrapping ErrDisconnected) or ctx ends (ctx's error, after the
// requests already read are answered). A read blocked on conn is cut short
// by ctx only when conn has SetReadDeadline; otherwise the caller closes it.
// Requests run concurrently on workers goroutines; replies are serialized.
func Serve(ctx context.Context, conn io.ReadWriter, b Backend, workers int, log logr.Logger) error {
	return serve(ctx, conn, b, workers, nil, log)
}

// serve is Serve calling ioFailed (when set) for each request the backend
// failed.
func serve(ctx context.Context, conn io.ReadWriter, b Backend, workers int, ioFailed func(), log logr.Logger) error {
	if workers <= 0 {
		workers = DefaultWorkers
	}
	s := &server{w: conn, b: b, log: log, ioFailed: ioFailed}
	stop := context.AfterFunc(ctx, func() {
		if d, ok := conn.(readDeadliner); ok {
			// A past deadline wakes the reader now.
			_ = d.SetReadDeadline(time.Unix(1, 0))
		}
	})
	defer stop()

	jobs := make(chan job)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for j := range jobs {
				s.handle(j)
			}
		})
	}
	err := s.readLoop(ctx, bufio.NewReaderSize(conn, 256<<10), jobs)
	close(jobs)
	wg.Wait()
	switch {
	case errors.Is(err, errDisc):
		log.V(1).Info("peer disconnected")
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("nbd serve: %w", ctx.Err())
	case errors.Is(err, errBadMagic):
		return err
	case isClosed(err):
		return fmt.Errorf("%w: %w", ErrDisconnected, err)
	}
	return fmt.Errorf("nbd serve: %w", err)
}

// isClosed tells whether a read error means the peer went away.
func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, unix.ECONNRESET) || errors.Is(err, unix.EPIPE) ||
		errors.Is(err, unix.ESHUTDOWN)
}

type job struct {
	req  request
	data []byte // WRITE payload; from the buffer pool
	bad  bool   // answer EINVAL without touching the backend
}

type server struct {
	w        io.Writer
	b        Backend
	log      logr.Logger
	ioFailed func() // nil: failures not counted

	wmu     sync.Mutex
	queued  []byte // replies waiting for the writer
	spare   []byte // an empty buffer for queueing, reused
	writing bool   // a goroutine is writing queued replies
	wbroken error  // first write error: the connection is gone
}

// readLoop reads requests and hands them to the workers. It returns errDisc
// on NBD_CMD_DISC, else the read or protocol error.
func (s *server) readLoop(ctx context.Context, r *bufio.Reader, jobs chan<- job) error {
	var hdr [requestSize]byte
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return err
		}
		req, err := parseRequest(hdr[:])
		if err != nil {
			return err
		}
		j := job{req: req}
		switch req.cmd {
		case cmdDisc:
			return errDisc
		case cmdWrite:
			if req.length > maxPayload {
				// Keep the stream in step, answer EINVAL.
				if _, err := io.CopyN(io.Discard, r, int64(req.length)); err != nil {
					return err
				}
				j.bad = true
				break
			}
			j.data = getBuf(int(req.length))
			if _, err := io.ReadFull(r, j.data); err != nil {
				putBuf(j.data)
				return err
			}
		case cmdRead:
			j.bad = req.length > maxPayload
		}
		jobs <- j
	}
}

// readPad is where READ data starts in its buffer.
const readPad = 4096

// handle runs one request and sends its reply.
func (s *server) handle(j job) {
	req := j.req
	if errno := s.check(req); j.bad || errno != errnoOK {
		if j.bad {
			errno = errnoInval
		}
		putBuf(j.data)
		s.reply(req.cookie, errno)
		return
	}
	if req.cmd == cmdRead {
		// The data lands page aligned (buffers start so) and the header
		// goes just before it: an O_DIRECT image reads straight into it.
		buf := getBuf(readPad + int(req.length))
		errno := s.read(buf[readPad:], int64(req.off))
		msg := buf[readPad-replySize:]
		if errno != errnoOK {
			msg = msg[:replySize]
		}
		putReply(msg, errno, req.cookie)
		s.send(msg)
		putBuf(buf)
		return
	}
	var err error
	errno := uint32(errnoOK)
	switch req.cmd {
	case cmdWrite:
		_, err = s.b.WriteAt(j.data, int64(req.off))
		putBuf(j.data)
	case cmdFlush:
		err = s.b.Sync()
	case cmdTrim, cmdWriteZeroes:
		if req.length == 0 {
			break // fallocate refuses an empty range; nothing to do
		}
		if req.cmd == cmdTrim {
			err = s.trim(int64(req.off), int64(req.length))
			break
		}
		err = s.zero(int64(req.off), int64(req.length), req.flags&cmdFlagNoHole != 0)
	default:
		s.log.Info("unknown command", "cmd", req.cmd)
		errno = errnoInval
	}
	if err == nil && errno == errnoOK && req.flags&cmdFlagFUA != 0 && req.cmd != cmdFlush {
		err = s.b.Sync()
	}
	if err != nil {
		s.log.Error(err, "request failed", "cmd", req.cmd, "off", req.off, "len", req.length)
		errno = s.failed(err)
	}
	s.reply(req.cookie, errno)
}

// check validates a request before it reaches the backend, with the errors
// proto.md asks for: EINVAL for a flag the command does not take, ENOSPC for
// a write past the end, EINVAL for a read or trim past it. FUA is accepted
// on any command (a no-op where nothing is written); unknown commands get
// their EINVAL in handle.
func (s *server) check(req request) uint32 {
	known := uint16(cmdFlagFUA)
	if req.cmd == cmdWriteZeroes {
		known |= cmdFlagNoHole
	}
	if req.flags&^known != 0 {
		return errnoInval
	}
	switch req.cmd {
	case cmdRead, cmdWrite, cmdTrim, cmdWriteZeroes:
		end := req.off + uint64(req.length)
		if end >= req.off && end <= uint64(s.b.Size()) {
			return errnoOK
		}
		if req.cmd == cmdWrite || req.cmd == cmdWriteZeroes {
			return errnoNoSpc
		}
		return errnoInval
	}
	return errnoOK // FLUSH carries no range
}

func (s *server) read(p []byte, off int64) uint32 {
	n, err := s.b.ReadAt(p, off)
	if err != nil {
		s.log.Error(err, "read failed", "off", off, "len", len(p))
		return s.failed(err)
	}
	clear(p[n:]) // past the file's end reads as zeros
	return errnoOK
}

// trim punches a hole; discard is a hint, so a file system without hole
// punching answers success.
func (s *server) trim(off, length int64) error {
	err := s.b.Fallocate(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length)
	if errors.Is(err, unix.EOPNOTSUPP) {
		return nil
	}
	return err
}

// zero makes a range read as zeros: a hole unless the kernel asked to keep
// the space allocated (NO_HOLE), then written zeros if fallocate can't.
func (s *server) zero(off, length int64, noHole bool) error {
	mode := uint32(unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE)
	if noHole {
		mode = unix.FALLOC_FL_ZERO_RANGE | unix.FALLOC_FL_KEEP_SIZE
	}
	err := s.b.Fallocate(mode, off, length)
	if !errors.Is(err, unix.EOPNOTSUPP) {
		return err
	}
	zeros := getBuf(int(min(length, 1<<20)))
	defer putBuf(zeros)
	clear(zeros)
	for length > 0 {
		n := min(length, int64(len(zeros)))
		if _, err := s.b.WriteAt(zeros[:n], off); err != nil {
			return err
		}
		off += n
		length -= n
	}
	return nil
}

// failed counts a request the backend failed and returns its errno.
func (s *server) failed(err error) uint32 {
	if s.ioFailed != nil {
		s.ioFailed()
	}
	return errnoOf(err)
}

// errnoOf maps a backend error to the wire: ENOSPC, EDQUOT and EFBIG are
// NBD_ENOSPC (proto.md), everything else is EIO.
func errnoOf(err error) uint32 {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) || errors.Is(err, unix.EFBIG) {
		return errnoNoSpc
	}
	return errnoIO
}

func (s *server) reply(cookie uint64, errno uint32) {
	var b [replySize]byte
	putReply(b[:], errno, cookie)
	s.send(b[:])
}

// maxSpare bounds the queue buffer kept for reuse.
const maxSpare = 4 << 20

// send queues one whole reply. Whoever finds no write under way becomes the
// writer and writes everything queued meanwhile in one go: under load many
// replies share a system call. After a write error the connection is dead
// and replies are dropped (the kernel requeues what it did not get).
func (s *server) send(b []byte) {
	s.wmu.Lock()
	if s.wbroken != nil {
		s.wmu.Unlock()
		return
	}
	if s.writing {
		s.queued = append(s.queued, b...)
		s.wmu.Unlock()
		return
	}
	s.writing = true
	// Our own reply goes out without a copy; then whatever queued meanwhile.
	for buf := b; len(buf) > 0 && s.wbroken == nil; {
		s.wmu.Unlock()
		_, err := s.w.Write(buf)
		s.wmu.Lock()
		if err != nil {
			s.wbroken = err
			s.log.V(1).Info("reply not sent", "err", err.Error())
		}
		if &buf[0] != &b[0] && cap(buf) <= maxSpare {
			s.spare = buf[:0]
		}
		buf, s.queued = s.queued, s.spare
		s.spare = nil
	}
	s.writing = false
	s.wmu.Unlock()
}
