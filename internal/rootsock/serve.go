package rootsock

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// Listener is what Serve accepts from (*net.UnixListener is one).
type Listener interface {
	AcceptUnix() (*net.UnixConn, error)
	Close() error
}

// Loop serves a root-only socket: a bounded number of connections at once,
// and an accept error other than the listener's close (running out of file
// descriptors, an aborted connection) never stops it.
type Loop struct {
	// MaxConns bounds the connections handled at once (0: 64).
	MaxConns int
	// Handle serves one connection; Serve closes it afterwards.
	Handle func(ctx context.Context, c *net.UnixConn)
	// Refuse answers a connection over MaxConns before Serve closes it;
	// nil closes it unanswered. It should read the request first: closing
	// a socket with unread data resets it, and the peer may lose the
	// answer. A short deadline is set.
	Refuse func(c *net.UnixConn)
	Log    logr.Logger
	// MinBackoff and MaxBackoff bound the wait after a failed accept
	// (0: 5ms and 1s).
	MinBackoff, MaxBackoff time.Duration
}

// Serve accepts connections on l until ctx ends or l is closed, and waits
// for the connections in hand to finish. Each gets ctx.
func (s *Loop) Serve(ctx context.Context, l Listener) error {
	stop := context.AfterFunc(ctx, func() { _ = l.Close() })
	defer stop()
	maxConns := s.MaxConns
	if maxConns <= 0 {
		maxConns = 64
	}
	minB, maxB := s.MinBackoff, s.MaxBackoff
	if minB <= 0 {
		minB = 5 * time.Millisecond
	}
	if maxB < minB {
		maxB = max(time.Second, minB)
	}
	slots := make(chan struct{}, maxConns)
	var inflight sync.WaitGroup
	defer inflight.Wait()
	backoff := time.Duration(0)
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			// EMFILE, ENFILE, ECONNABORTED and the like pass: wait a little
			// (connections in hand free descriptors) and accept again.
			backoff = min(max(2*backoff, minB), maxB)
			s.Log.Error(err, "accept failed; retrying", "backoff", backoff)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			continue
		}
		backoff = 0
		select {
		case slots <- struct{}{}:
		default:
			s.refuse(c, maxConns)
			continue
		}
		inflight.Add(1)
		go func() {
			defer func() { <-slots; inflight.Done() }()
			defer func() { _ = c.Close() }()
			s.Handle(ctx, c)
		}()
	}
}

func (s *Loop) refuse(c *net.UnixConn, maxConns int) {
	defer func() { _ = c.Close() }()
	s.Log.Info("refused a connection: too many at once", "max", maxConns)
	if s.Refuse == nil {
		return
	}
	// Answered inline, so refusals never pile up; the deadline bounds a
	// peer that sends or reads nothing.
	_ = c.SetDeadline(time.Now().Add(100 * time.Millisecond))
	s.Refuse(c)
}
