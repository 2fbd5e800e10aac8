package mount

import (
	"context"
	"fmt"
	"sync"
)

// flights runs at most one call per key at a time; a caller that comes
// while one is in flight waits for it and takes its result. A call that
// blocks in the kernel (umount or stat of a hard NFS mount whose server is
// away) cannot be cancelled, so a caller stops waiting when its context
// ends and the call goes on alone: however often kubelet or a controller
// retries, one thread and one process per path stay blocked, not one per
// retry.
type flights struct {
	mu sync.Mutex
	m  map[string]*flight
}

type flight struct {
	done chan struct{}
	err  error
}

// do runs fn for key unless a call for key is in flight already, and
// waits for that call or for ctx to end. fn must not depend on ctx: it may
// outlive every caller.
func (f *flights) do(ctx context.Context, key string, fn func() error) error {
	f.mu.Lock()
	if f.m == nil {
		f.m = map[string]*flight{}
	}
	c, ok := f.m[key]
	if !ok {
		c = &flight{done: make(chan struct{})}
		f.m[key] = c
		go func() {
			c.err = fn()
			f.mu.Lock()
			delete(f.m, key)
			f.mu.Unlock()
			close(c.done)
		}()
	}
	f.mu.Unlock()
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return fmt.Errorf("%s: still in progress: %w", key, ctx.Err())
	}
}
