package testenv

import (
	"context"
	"testing"
)

// Serve runs serve in the background until the test ends: then it cancels
// the context it gave serve (and returns here) and fails the test if serve
// returned an error (what names it).
func Serve(t testing.TB, what string, serve func(ctx context.Context) error) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: %v", what, err)
		}
	})
	return ctx
}
