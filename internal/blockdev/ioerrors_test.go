package blockdev_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-io/berth/internal/blockdev"
)

// TestIOErrorsCarryOn: the count is written while it changes and once
// more at the end, and the next server of the volume goes on from it.
func TestIOErrorsCarryOn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vol.ioerrors")
	first, err := blockdev.OpenIOErrors(path)
	if err != nil || first.Count() != 0 {
		t.Fatalf("a new count: %v, %v", first.Count(), err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx, 10*time.Millisecond) }()
	first.Add()
	first.Add()
	deadline := time.Now().Add(5 * time.Second)
	for n, _ := blockdev.ReadIOErrors(path); n != 2; n, _ = blockdev.ReadIOErrors(path) {
		if time.Now().After(deadline) {
			t.Fatalf("file holds %d, want 2 while the server runs", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	first.Add() // the last, written when the server stops
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	next, err := blockdev.OpenIOErrors(path)
	if err != nil || next.Count() != 3 {
		t.Fatalf("the next server starts at %d (%v), want 3", next.Count(), err)
	}
	var none *blockdev.IOErrors
	none.Add() // not counted: no panic
	if none.Count() != 0 || none.Run(context.Background(), time.Second) != nil {
		t.Error("a nil count counts")
	}
}
