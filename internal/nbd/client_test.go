package nbd

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"
)

// testClient plays the kernel's side of the transmission phase: requests
// with cookies, replies matched by cookie, any number in flight.
type testClient struct {
	conn    *os.File
	wmu     sync.Mutex
	mu      sync.Mutex
	pending map[uint64]*call
	next    atomic.Uint64
	done    chan struct{}
	err     error // why the reply reader stopped
}

type call struct {
	read  uint32 // payload length expected on success
	errno uint32
	data  []byte
	done  chan struct{}
}

func newTestClient(conn *os.File) *testClient {
	c := &testClient{conn: conn, pending: map[uint64]*call{}, done: make(chan struct{})}
	go c.readReplies()
	return c
}

func (c *testClient) readReplies() {
	defer close(c.done)
	var hdr [replySize]byte
	for {
		if _, err := io.ReadFull(c.conn, hdr[:]); err != nil {
			c.fail(err)
			return
		}
		r, err := parseReply(hdr[:])
		if err != nil {
			c.fail(err)
			return
		}
		c.mu.Lock()
		cl := c.pending[r.cookie]
		delete(c.pending, r.cookie)
		c.mu.Unlock()
		if cl == nil {
			c.fail(fmt.Errorf("reply for unknown cookie %d", r.cookie))
			return
		}
		cl.errno = r.errno
		if r.errno == 0 && cl.read > 0 {
			cl.data = make([]byte, cl.read)
			if _, err := io.ReadFull(c.conn, cl.data); err != nil {
				c.fail(err)
				return
			}
		}
		close(cl.done)
	}
}

func (c *testClient) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.err = err
	for k, cl := range c.pending {
		cl.errno = ^uint32(0)
		close(cl.done)
		delete(c.pending, k)
	}
}

// start sends one request; wait on the call for its reply.
func (c *testClient) start(cmd, flags uint16, off uint64, length uint32, data []byte) (*call, error) {
	cookie := c.next.Add(1)
	cl := &call{done: make(chan struct{})}
	if cmd == cmdRead {
		cl.read = length
	}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, c.err
	}
	c.pending[cookie] = cl
	c.mu.Unlock()
	buf := make([]byte, requestSize+len(data))
	putRequest(buf, request{flags: flags, cmd: cmd, cookie: cookie, off: off, length: length})
	copy(buf[requestSize:], data)
	c.wmu.Lock()
	_, err := c.conn.Write(buf)
	c.wmu.Unlock()
	return cl, err
}

// do sends one request and waits for its reply.
func (c *testClient) do(cmd, flags uint16, off uint64, length uint32, data []byte) (uint32, []byte, error) {
	cl, err := c.start(cmd, flags, off, length, data)
	if err != nil {
		return 0, nil, err
	}
	<-cl.done
	if cl.errno == ^uint32(0) {
		return 0, nil, fmt.Errorf("connection failed: %w", c.err)
	}
	return cl.errno, cl.data, nil
}

// sendRaw writes bytes as they are (bad requests).
func (c *testClient) sendRaw(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.conn.Write(b)
	return err
}

// served is a Serve running on one end of a socketpair, a client on the other.
type served struct {
	client *testClient
	server *os.File
	cancel context.CancelFunc
	result chan error
}

// socketpair returns two connected non-blocking ends.
func socketpair(t testing.TB) (a, b *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	return os.NewFile(uintptr(fds[0]), "server"), os.NewFile(uintptr(fds[1]), "client")
}

func testLog(t testing.TB) logr.Logger {
	if tt, ok := t.(*testing.T); ok {
		return testr.New(tt)
	}
	return logr.Discard()
}

func startServe(t testing.TB, b Backend, workers int) *served {
	t.Helper()
	return startServeCounting(t, b, workers, nil)
}

// startServeCounting is startServe with ioFailed called for each request
// the backend fails.
func startServeCounting(t testing.TB, b Backend, workers int, ioFailed func()) *served {
	t.Helper()
	server, client := socketpair(t)
	ctx, cancel := context.WithCancel(context.Background())
	s := &served{server: server, cancel: cancel, result: make(chan error, 1)}
	go func() { s.result <- serve(ctx, server, b, workers, ioFailed, testLog(t)) }()
	s.client = newTestClient(client)
	t.Cleanup(func() {
		cancel()
		_ = client.Close()
		_ = s.wait(t)
		_ = server.Close()
	})
	return s
}

func (s *served) wait(t testing.TB) error {
	t.Helper()
	err := <-s.result
	s.result <- err // Cleanup reads it again
	return err
}
