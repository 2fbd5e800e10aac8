package backend

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeQuiescer hands out the hold it is given and counts releases.
type fakeQuiescer struct {
	stable   bool
	ctx      context.Context
	held     []string
	released int
}

func (q *fakeQuiescer) Quiesce(ctx context.Context, volumeID string) (Hold, error) {
	q.held = append(q.held, volumeID)
	hctx := q.ctx
	if hctx == nil {
		hctx = ctx
	}
	return Hold{Stable: q.stable, Ctx: hctx, Release: func() { q.released++ }}, nil
}

// TestCopiesHoldTheSource: snapshots and clones of a volume take a hold on
// it and release it; without reflink, a hold that is not stable (a staged
// block volume) or that runs out refuses the copy with ErrSourceInUse, and
// a restore from a snapshot takes no hold.
func TestCopiesHoldTheSource(t *testing.T) {
	ctx := context.Background()
	l, dir := newLocal(t)
	if reflinks(t, dir) {
		t.Skip("the temp dir reflinks: every copy is atomic, no hold can refuse it")
	}
	img, err := l.Create(ctx, "vol", 64*mib)
	if err != nil {
		t.Fatal(err)
	}
	writeAt(t, img.Path, "data to copy")
	q := &fakeQuiescer{stable: true}
	l.WithQuiescer(q)
	if _, err := l.CreateSnapshot(ctx, "snap", "vol"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CreateFromVolume(ctx, "clone", "vol", 64*mib); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CreateFromSnapshot(ctx, "restored", "snap", 64*mib); err != nil {
		t.Fatal(err)
	}
	if len(q.held) != 2 || q.held[0] != "vol" || q.held[1] != "vol" || q.released != 2 {
		t.Errorf("holds %v, %d released; want vol twice, both released", q.held, q.released)
	}

	q.stable = false
	if _, err := l.CreateSnapshot(ctx, "snap-unstable", "vol"); !errors.Is(err, ErrSourceInUse) {
		t.Errorf("snapshot under an unstable hold: %v, want ErrSourceInUse", err)
	}
	q.stable = true
	expired, cancel := context.WithCancel(ctx)
	cancel()
	q.ctx = expired
	if _, err := l.CreateFromVolume(ctx, "clone-late", "vol", 64*mib); !errors.Is(err, ErrSourceInUse) {
		t.Errorf("clone past the hold's limit: %v, want ErrSourceInUse", err)
	}
	if q.released != 4 {
		t.Errorf("%d holds released, want 4", q.released)
	}
	for _, id := range []string{"snap-unstable", "clone-late"} {
		if ents, _ := filepath.Glob(filepath.Join(dir, "*", id+"*")); len(ents) != 0 {
			t.Errorf("refused copy left %v", ents)
		}
	}
}

func reflinks(t *testing.T, dir string) bool {
	t.Helper()
	a, err := os.CreateTemp(dir, "probe-")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Close(); _ = os.Remove(a.Name()) }()
	b, err := os.CreateTemp(dir, "probe-")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Close(); _ = os.Remove(b.Name()) }()
	return unix.IoctlFileClone(int(b.Fd()), int(a.Fd())) == nil
}
