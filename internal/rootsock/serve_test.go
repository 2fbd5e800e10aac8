package rootsock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

// flakyListener fails its first accepts with the given errors, then hands
// out the connections of a real listener.
type flakyListener struct {
	*net.UnixListener
	mu   sync.Mutex
	errs []error
}

func (l *flakyListener) AcceptUnix() (*net.UnixConn, error) {
	l.mu.Lock()
	if len(l.errs) > 0 {
		err := l.errs[0]
		l.errs = l.errs[1:]
		l.mu.Unlock()
		return nil, err
	}
	l.mu.Unlock()
	return l.UnixListener.AcceptUnix()
}

func listen(t *testing.T) (*net.UnixListener, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	return l, path
}

func echo(_ context.Context, c *net.UnixConn) {
	buf := make([]byte, 16)
	n, _ := c.Read(buf)
	_, _ = c.Write(buf[:n])
}

func ask(t *testing.T, path string) (string, error) {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	// A refused client's write may fail: the refusal is read all the same.
	_, _ = c.Write([]byte("hi"))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	return string(buf[:n]), err
}

// TestLoopRetriesAcceptErrors (fake errors): EMFILE, ENFILE and
// ECONNABORTED from accept are waited out; only the close ends Serve.
func TestLoopRetriesAcceptErrors(t *testing.T) {
	real, path := listen(t)
	errs := []error{
		&net.OpError{Op: "accept", Net: "unix", Err: os.NewSyscallError("accept4", syscall.EMFILE)},
		&net.OpError{Op: "accept", Net: "unix", Err: os.NewSyscallError("accept4", syscall.ENFILE)},
		&net.OpError{Op: "accept", Net: "unix", Err: os.NewSyscallError("accept4", syscall.ECONNABORTED)},
		errors.New("something else"),
	}
	l := &flakyListener{UnixListener: real, errs: errs}
	loop := &Loop{Handle: echo, Log: logr.Discard(), MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- loop.Serve(ctx, l) }()
	if got, err := ask(t, path); err != nil || got != "hi" {
		t.Fatalf("after accept errors: %q, %v", got, err)
	}
	select {
	case err := <-done:
		t.Fatalf("Serve ended on an accept error: %v", err)
	default:
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve after close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not end on close")
	}
}

// TestLoopCapsConnections: over MaxConns, a client gets the refusal at
// once, and a slot that frees serves again.
func TestLoopCapsConnections(t *testing.T) {
	l, path := listen(t)
	release := make(chan struct{})
	loop := &Loop{MaxConns: 2, Log: logr.Discard(),
		Handle: func(ctx context.Context, c *net.UnixConn) { <-release; echo(ctx, c) },
		Refuse: func(c *net.UnixConn) { _, _ = c.Read(make([]byte, 16)); _, _ = fmt.Fprint(c, "busy") }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- loop.Serve(ctx, l) }()
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	time.Sleep(50 * time.Millisecond)
	if got, _ := ask(t, path); got != "busy" {
		t.Errorf("third client got %q, want the refusal", got)
	}
	close(release)
	for _, c := range held {
		_ = c.Close()
	}
	time.Sleep(50 * time.Millisecond)
	if got, err := ask(t, path); got != "hi" {
		t.Errorf("client after slots freed: %q, %v", got, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
