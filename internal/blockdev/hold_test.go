package blockdev

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-io/berth/internal/blockdev/imagefile"
)

func TestHoldForReturnsWhenTheAgentLets(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { HoldFor(r, time.Minute)(context.Background()); close(done) }()
	select {
	case <-done:
		t.Fatal("returned before the agent closed its end")
	case <-time.After(50 * time.Millisecond):
	}
	_ = w.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("still holding after the agent closed its end")
	}
}

func TestHoldForIsBounded(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Close() }()
	done := make(chan struct{})
	go func() { HoldFor(r, 20*time.Millisecond)(context.Background()); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("held past its bound while the agent kept its end open")
	}
}

func TestHoldForEndsOnStop(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Close() }()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { HoldFor(r, time.Minute)(ctx); close(done) }()
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("still holding after the server was told to stop")
	}
}

// TestStopWhileHeldLeavesTheRequests: a takeover stopped during its hold
// returns without asking the kernel to resend (the connection here is a
// pipe: anything the server wrote would be in it) and starts no worker.
func TestStopWhileHeldLeavesTheRequests(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close(); _ = w.Close() }()
	path := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(path, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	img, err := imagefile.Open(path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = img.Close() }()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, err := NewServer(Config{Dev: int(w.Fd()), Image: img, Saved: &Settings{},
		Hold: func(ctx context.Context) { cancel(); <-ctx.Done() }})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(ctx); err != nil {
		t.Fatalf("Serve after a stop during the hold: %v", err)
	}
	select {
	case <-srv.Ready():
	default:
		t.Error("not ready: the agent would wait for the start of a held server")
	}
	_ = w.Close()
	if b, err := io.ReadAll(r); err != nil || len(b) != 0 {
		t.Errorf("the server wrote %d bytes to the connection (%v), want none", len(b), err)
	}
}
