package blockdev

import (
	"errors"

	"golang.org/x/sys/unix"
)

// errLent tells the worker that the request took its buffers along.
var errLent = errors.New("buffers lent to an asynchronous request")

// startAsync starts a READ or WRITE on an asynchronous image (backing.Async)
// and answers it when it ends, from the image's thread: the worker goes
// back to taking requests at once, and b goes along with the request (errLent:
// the worker maps or takes other buffers). The request counts as in flight
// until answered, so a stopping server waits for it. payload puts the
// reply's payload for n bytes done in b and returns its length.
//
// Healing is as for a synchronous request: one a server dies with is
// unanswered, and the kernel resends it to the next server.
func (s *Server) startAsync(b *buffers, h inHeader, what string, off int64, size int,
	start func(done func(int, error)) error, payload func(n int) int) error {
	s.inflight.Add(1)
	err := start(func(n int, err error) {
		defer s.inflight.Add(-1)
		defer s.giveBack(b)
		errno := unix.Errno(0)
		if err != nil {
			s.cfg.Log.Error(err, what+" failed", "offset", off, "size", size)
			errno = s.ioFailed(err)
		} else {
			n = payload(n)
		}
		if err := s.reply(b, h.unique, errno, n); err != nil && !errors.Is(err, ErrUnmounted) {
			s.cfg.Log.Error(err, "answer "+what+" failed", "offset", off, "size", size)
		}
	})
	if err == nil {
		return errLent
	}
	// Not started, so done is never called: answer here, keep b.
	s.inflight.Add(-1)
	s.cfg.Log.Error(err, what+" failed", "offset", off, "size", size)
	return s.reply(b, h.unique, s.ioFailed(err), 0)
}
