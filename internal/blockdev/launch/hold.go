package launch

import (
	"context"
	"os"
	"sync"
)

// HoldGroup holds the I/O of the servers a heal pass starts until the pass
// has started them all. After an agent restart every volume's server
// starts at once; measured with make bench's heal at scale (100 volumes
// under writers, 2 cores), the I/O of the volumes healed first took more
// than half of the CPU while the rest were still starting, and the last
// volume's first write came at p99 1.5-1.6 s. Held until all are started,
// the starts have the CPU to themselves: p99 0.64 s, and p50 lower too.
// Each server bounds its own wait (cmd blockdev --hold-fd), so a start
// that hangs, or an agent that dies, delays the others by that bound at
// most.
type HoldGroup struct {
	mu       sync.Mutex
	pending  int
	held     []*os.File
	released bool
}

// NewHoldGroup expects n calls of Done, one per volume of the pass.
func NewHoldGroup(n int) *HoldGroup { return &HoldGroup{pending: n} }

// hold keeps w, the write end of a started server's hold pipe, until the
// release; after it, w is closed at once.
func (g *HoldGroup) hold(w *os.File) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.released {
		_ = w.Close()
		return
	}
	g.held = append(g.held, w)
}

// Done says that one volume of the pass has its server started, or needs
// none, or failed; after the n-th the group releases. Nil-safe.
func (g *HoldGroup) Done() {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.pending--
	last := g.pending <= 0
	g.mu.Unlock()
	if last {
		g.Release()
	}
}

// Release lets every held server resume its I/O (it closes their hold
// pipes), and every later one at once. Idempotent and nil-safe.
func (g *HoldGroup) Release() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.released = true
	for _, w := range g.held {
		_ = w.Close()
	}
	g.held = nil
}

type holdKey struct{}

// WithHold is ctx with g: the servers started under it are held by g.
func WithHold(ctx context.Context, g *HoldGroup) context.Context {
	return context.WithValue(ctx, holdKey{}, g)
}

// HoldFrom is the HoldGroup of ctx, or nil.
func HoldFrom(ctx context.Context) *HoldGroup {
	g, _ := ctx.Value(holdKey{}).(*HoldGroup)
	return g
}
