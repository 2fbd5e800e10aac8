package backend

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr/testr"

	"github.com/berth-io/berth/internal/volerr"
)

// TestSetPicksTheClusterDataDir: a new image goes to its cluster's data
// dir; an existing one is found wherever it is; a copy never crosses data
// dirs; a cluster whose data dir is not served gets ErrNoDataDir.
func TestSetPicksTheClusterDataDir(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	dirOf := map[string]string{"vol-a": a, "vol-b": b, "clone-b": b, "vol-x": filepath.Join(root, "x")}
	s, err := NewSet([]string{b, a}, func(_ context.Context, id string) (Place, error) {
		if d, ok := dirOf[id]; ok {
			return Place{Dir: d}, nil
		}
		return Place{}, fmt.Errorf("volume %s: %w", id, ErrNotFound)
	}, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Dirs(); len(got) != 2 || got[0] != a || got[1] != b {
		t.Fatalf("Dirs() = %v, want sorted [a b]", got)
	}
	for id, dir := range map[string]string{"vol-a": a, "vol-b": b} {
		img, err := s.Create(ctx, id, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Dir(filepath.Dir(img.Path)) != dir {
			t.Errorf("%s made at %s, want under %s", id, img.Path, dir)
		}
		if got, err := s.Get(ctx, id); err != nil || got.Path != img.Path {
			t.Errorf("Get(%s) = %v, %v", id, got, err)
		}
	}
	if _, err := s.Create(ctx, "vol-x", 1<<20); !errors.Is(err, ErrNoDataDir) {
		t.Errorf("create in an unserved data dir: %v, want ErrNoDataDir", err)
	}
	if _, err := s.Create(ctx, "vol-unknown", 1<<20); err == nil {
		t.Error("create of a volume with no cluster succeeded with two data dirs")
	}
	if _, err := s.CreateFromVolume(ctx, "clone-b", "vol-a", 1<<20); !errors.Is(err, volerr.ErrInvalid) {
		t.Errorf("clone across data dirs: %v, want volerr.ErrInvalid", err)
	}
	if _, err := s.CreateSnapshot(ctx, "snap-a", "vol-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(a, "snapshots", "snap-a.img")); err != nil {
		t.Errorf("snapshot not beside its source: %v", err)
	}
	if _, err := s.CreateFromSnapshot(ctx, "clone-b", "snap-a", 1<<20); !errors.Is(err, volerr.ErrInvalid) {
		t.Errorf("restore across data dirs: %v, want volerr.ErrInvalid", err)
	}
	if _, err := s.Expand(ctx, "vol-b", 2<<20); err != nil {
		t.Error(err)
	}
	for _, id := range []string{"vol-a", "vol-b", "vol-gone"} {
		if err := s.Delete(ctx, id); err != nil {
			t.Errorf("Delete(%s): %v", id, err)
		}
	}
	if err := s.DeleteSnapshot(ctx, "snap-a"); err != nil {
		t.Error(err)
	}
	if _, err := s.Get(ctx, "vol-a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after delete: %v", err)
	}

	// An agent run alone (one data dir, no StorageCluster object) puts
	// every image there.
	one, err := NewSet([]string{a}, func(context.Context, string) (Place, error) { return Place{}, ErrNotFound }, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := one.Create(ctx, "vol-lone", 1<<20); err != nil {
		t.Errorf("single data dir without cluster: %v", err)
	}
}
