package blockdev

import (
	"context"
	"os"
	"testing"
	"time"
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
