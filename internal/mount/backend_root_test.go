package mount

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr/testr"

	"github.com/berth-io/berth/internal/backend"
)

// TestRootSnapshotCloneRestore writes files through a real mount, takes a
// snapshot and a clone with the local backend, and reads them back through
// fresh mounts of the copies.
func TestRootSnapshotCloneRestore(t *testing.T) {
	e := newRootEnv(t)
	l, err := backend.NewLocal(filepath.Join(e.dir, "data"), testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	src, err := l.Create(e.ctx, "src", 64*mib)
	if err != nil {
		t.Fatal(err)
	}
	e.withMounted(t, src.Path, func(dir string) { writeFile(t, dir, "a", "before snapshot") })
	if _, err := l.CreateSnapshot(e.ctx, "snap", "src"); err != nil {
		t.Fatal(err)
	}
	e.withMounted(t, src.Path, func(dir string) { writeFile(t, dir, "a", "after snapshot") })
	clone, err := l.CreateFromVolume(e.ctx, "clone", "src", 64*mib)
	if err != nil {
		t.Fatal(err)
	}
	restored, err := l.CreateFromSnapshot(e.ctx, "restored", "snap", 128*mib)
	if err != nil {
		t.Fatal(err)
	}
	e.withMounted(t, restored.Path, func(dir string) { readFile(t, dir, "a", "before snapshot") })
	e.withMounted(t, clone.Path, func(dir string) { readFile(t, dir, "a", "after snapshot") })
}

// withMounted attaches img, stages it, runs fn on the mount, then unstages
// and detaches, as the node service would around a pod.
func (e *rootEnv) withMounted(t *testing.T, img string, fn func(dir string)) {
	t.Helper()
	dev := e.attach(t, img)
	staging := e.path("staging")
	if err := e.mgr.Stage(e.ctx, StageRequest{Device: dev, StagingPath: staging}); err != nil {
		t.Fatal(err)
	}
	fn(staging)
	e.unstage(t, staging)
	if err := e.loop.Detach(e.ctx, dev); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, dir, name, want string) {
	t.Helper()
	got, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil || string(got) != want {
		t.Fatalf("%s: %q %v, want %q", name, got, err, want)
	}
}
