package mount

import (
	"context"
	"fmt"
	"sync"
)

// inflight runs calls that may block in the kernel for as long as a server
// is gone (a FUSE file's, a hard NFS mount's), where no kill or context
// reaches them. A caller waits until its context ends; the call goes on,
// and a later caller with the same key joins it, so that a path that
// never answers holds one thread (and one process) rather than one per
// lookup or retry.
type inflight struct {
	mu    sync.Mutex
	calls map[string]*call
	// stalled is wrapped, with the context's error, in what a caller
	// whose context ended gets.
	stalled error
}

type call struct {
	done chan struct{}
	val  any
	err  error
}

// do runs fn for key unless a call for key is in flight already, and
// waits for that call or for ctx to end. fn must not depend on ctx: it may
// outlive every caller.
func (f *inflight) do(ctx context.Context, key string, fn func() (any, error)) (any, error) {
	f.mu.Lock()
	c, ok := f.calls[key]
	if !ok {
		c = &call{done: make(chan struct{})}
		if f.calls == nil {
			f.calls = map[string]*call{}
		}
		f.calls[key] = c
		go func() {
			c.val, c.err = fn()
			f.mu.Lock()
			delete(f.calls, key)
			f.mu.Unlock()
			close(c.done)
		}()
	}
	f.mu.Unlock()
	select {
	case <-c.done:
		return c.val, c.err
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: %w: %w", key, f.stalled, ctx.Err())
	}
}

// doErr is do for a call with no value.
func (f *inflight) doErr(ctx context.Context, key string, fn func() error) error {
	_, err := f.do(ctx, key, func() (any, error) { return nil, fn() })
	return err
}
