package socket

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-io/berth/internal/flexvolume"
	"github.com/berth-io/berth/internal/testenv"
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
	testenv.Serve(t, "Serve", func(ctx context.Context) error { return s.Serve(ctx, l) })
	return path
}

// TestAcceptSurvivesEMFILE runs the real socket out of file descriptors:
// accept fails with EMFILE, and the waiting client is answered once
// descriptors are free again.
func TestAcceptSurvivesEMFILE(t *testing.T) {
	log := &testenv.EMFILELog{}
	path := start(t, NewServer(blockingOps{}, log.Logger()))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	handshake := func() error {
		resp, err := Call(ctx, path, Request{Op: OpHandshake})
		if err == nil && !resp.OK {
			err = fmt.Errorf("handshake refused: %s", resp.Message)
		}
		return err
	}
	if err := handshake(); err != nil {
		t.Fatal(err)
	}
	if err := testenv.OutOfFDs(t, log, handshake); err != nil {
		t.Fatalf("client waiting while the agent had no descriptors: %v", err)
	}
	if err := handshake(); err != nil {
		t.Fatalf("agent socket after EMFILE: %v", err)
	}
}

// TestTooManyClientsRefused: over MaxConns, a client is told the agent is
// busy at once instead of waiting; the handshake works again once a slot
// frees.
func TestTooManyClientsRefused(t *testing.T) {
	ops := blockingOps{release: make(chan struct{})}
	s := NewServer(ops, logr.Discard())
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

// TestMountsWaitForTheHandshake: with RequireHandshake, mount and unmount
// are refused NotReady (and reach nothing) until a handshake was answered;
// then they are served.
func TestMountsWaitForTheHandshake(t *testing.T) {
	ops := &recordingOps{}
	s := NewServer(ops, logr.Discard())
	s.RequireHandshake = true
	path := start(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mount := Request{Op: OpMount, Mount: &flexvolume.MountRequest{MountDir: "/m", Volume: "v"}}
	for _, req := range []Request{mount, {Op: OpUnmount, MountDir: "/m"}} {
		resp, err := Call(ctx, path, req)
		if err != nil || resp.OK || resp.Code != CodeNotReady || !strings.Contains(resp.Message, "not ready") {
			t.Fatalf("%s before the handshake: %+v %v", req.Op, resp, err)
		}
	}
	if len(ops.mounts)+len(ops.unmounts) != 0 {
		t.Fatalf("refused requests reached the agent: %+v", ops)
	}
	if resp, err := Call(ctx, path, Request{Op: OpHandshake}); err != nil || !resp.OK {
		t.Fatalf("handshake: %+v %v", resp, err)
	}
	if resp, err := Call(ctx, path, mount); err != nil || !resp.OK || len(ops.mounts) != 1 {
		t.Fatalf("mount after the handshake: %+v %v (%d mounts)", resp, err, len(ops.mounts))
	}
}
