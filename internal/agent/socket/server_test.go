package socket

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/flexvolume"
)

// blockingOps answers the handshake; a mount waits until released.
type blockingOps struct{ release chan struct{} }

func (blockingOps) Node() string { return "n1" }
func (o blockingOps) FlexMount(ctx context.Context, _ flexvolume.MountRequest) error {
	select {
	case <-o.release:
	case <-ctx.Done():
	}
	return nil
}
func (blockingOps) FlexUnmount(context.Context, string) error { return nil }

func start(t *testing.T, s *Server) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the agent socket admits only root peers; run as root")
	}
	path := filepath.Join(t.TempDir(), "agent.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return path
}

// TestAcceptSurvivesEMFILE runs the real socket out of file descriptors
// (RLIMIT_NOFILE lowered so that the client's socket is the last fd this
// process may open): accept fails with EMFILE, and the waiting client is
// answered once descriptors are free again.
func TestAcceptSurvivesEMFILE(t *testing.T) {
	var failed atomic.Int32
	log := funcr.New(func(_, args string) {
		if strings.Contains(args, "too many open files") {
			failed.Add(1)
		}
	}, funcr.Options{})
	path := start(t, NewServer(blockingOps{}, log))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := Call(ctx, path, Request{Op: OpHandshake}); err != nil {
		t.Fatal(err)
	}
	answered := make(chan error, 1)
	restore := fewFDs(t, func() {
		go func() {
			resp, err := Call(ctx, path, Request{Op: OpHandshake})
			if err == nil && !resp.OK {
				err = errString(resp.Message)
			}
			answered <- err
		}()
	})
	deadline := time.Now().Add(5 * time.Second)
	for failed.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	restore()
	if failed.Load() == 0 {
		t.Fatal("accept never failed with EMFILE: the test did not run the socket out of descriptors")
	}
	if err := <-answered; err != nil {
		t.Fatalf("client waiting while the agent had no descriptors: %v", err)
	}
	if resp, err := Call(ctx, path, Request{Op: OpHandshake}); err != nil || !resp.OK {
		t.Fatalf("agent socket after EMFILE: %+v, %v", resp, err)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// fewFDs lowers RLIMIT_NOFILE so that exactly one more descriptor can be
// opened, runs start (which should open it, a client socket), and returns
// the function that restores the limit.
func fewFDs(t *testing.T, start func()) (restore func()) {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	free, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	_ = unix.Close(free)
	var once sync.Once
	restore = func() {
		once.Do(func() {
			if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Cleanup(restore)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: uint64(free) + 1, Max: old.Max}); err != nil {
		t.Fatal(err)
	}
	start()
	return restore
}

// TestTooManyClientsRefused: over MaxConns, a client is told the agent is
// busy at once instead of waiting; the handshake works again once a slot
// frees.
func TestTooManyClientsRefused(t *testing.T) {
	ops := blockingOps{release: make(chan struct{})}
	s := NewServer(ops, funcr.New(func(string, string) {}, funcr.Options{}))
	s.MaxConns = 1
	path := start(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mounting := make(chan error, 1)
	go func() {
		_, err := Call(ctx, path, Request{Op: OpMount, Mount: &flexvolume.MountRequest{}})
		mounting <- err
	}()
	time.Sleep(100 * time.Millisecond)
	resp, err := Call(ctx, path, Request{Op: OpHandshake})
	if err != nil || resp.OK || resp.Code != CodeBusy || !strings.Contains(resp.Message, "retry") {
		t.Errorf("client over the limit: %+v, %v; want Busy", resp, err)
	}
	close(ops.release)
	if err := <-mounting; err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if resp, err := Call(ctx, path, Request{Op: OpHandshake}); err != nil || !resp.OK {
		t.Errorf("handshake after the slot freed: %+v, %v", resp, err)
	}
}
