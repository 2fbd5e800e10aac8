package backend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/volerr"
)

const mib = 1 << 20

func newLocal(t *testing.T) (*Local, string) {
	t.Helper()
	dir := t.TempDir()
	l, err := NewLocal(dir, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	return l, dir
}

func TestCreateIdempotent(t *testing.T) {
	ctx := context.Background()
	l, _ := newLocal(t)
	img, err := l.Create(ctx, "pvc-1", 64*mib)
	if err != nil {
		t.Fatal(err)
	}
	if img.Size != 64*mib {
		t.Fatalf("size %d", img.Size)
	}
	// Reserved by default (F12): the whole size is allocated.
	if used, _ := allocated(img.Path); used < img.Size {
		t.Fatalf("new image not reserved: %d of %d bytes allocated", used, img.Size)
	}
	again, err := l.Create(ctx, "pvc-1", 64*mib)
	if err != nil || again != img {
		t.Fatalf("retry: %v %+v", err, again)
	}
	if _, err := l.Create(ctx, "pvc-1", 128*mib); !errors.Is(err, ErrExists) {
		t.Fatalf("other size: want ErrExists, got %v", err)
	}
	// Rounded sizes compare after rounding.
	odd, err := l.Create(ctx, "odd", 1000)
	if err != nil || odd.Size != 4096 {
		t.Fatalf("odd size: %v %+v", err, odd)
	}
	if _, err := l.Create(ctx, "odd", 4000); err != nil {
		t.Fatalf("odd size retry: %v", err)
	}
}

func TestCreateRejects(t *testing.T) {
	ctx := context.Background()
	l, dir := newLocal(t)
	for _, id := range []string{"", "a/b", "..", "a..b", ".hidden", "-x", "a b", string(make([]byte, 129))} {
		if _, err := l.Create(ctx, id, mib); !errors.Is(err, volerr.ErrInvalid) {
			t.Errorf("id %q: want volerr.ErrInvalid, got %v", id, err)
		}
	}
	long := bytes.Repeat([]byte("a"), 128)
	if err := ValidateID(string(long)); err != nil {
		t.Errorf("128-char id refused: %v", err)
	}
	for _, size := range []int64{0, -1} {
		if _, err := l.Create(ctx, "v", size); !errors.Is(err, volerr.ErrInvalid) {
			t.Errorf("size %d: want volerr.ErrInvalid, got %v", size, err)
		}
	}
	free, err := l.Capacity(ctx)
	if err != nil || free <= 0 {
		t.Fatalf("capacity %d %v", free, err)
	}
	if _, err := l.Create(ctx, "huge", free+1<<30); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("huge: want ErrNoSpace, got %v", err)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, "volumes"))
	if len(ents) != 0 {
		t.Fatalf("refused creates left files: %v", ents)
	}
}

func TestGetListDelete(t *testing.T) {
	ctx := context.Background()
	l, _ := newLocal(t)
	if _, err := l.Get(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("want ErrNotFound, got %v", err)
	}
	for _, id := range []string{"b", "a", "c"} {
		if _, err := l.Create(ctx, id, mib); err != nil {
			t.Fatal(err)
		}
	}
	list, err := l.List(ctx)
	if err != nil || len(list) != 3 || list[0].ID != "a" || list[2].ID != "c" {
		t.Fatalf("list: %v %+v", err, list)
	}
	for range 2 {
		if err := l.Delete(ctx, "b"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Get(ctx, "b"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
}

func TestExpand(t *testing.T) {
	ctx := context.Background()
	l, _ := newLocal(t)
	if _, err := l.Expand(ctx, "missing", mib); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing: %v", err)
	}
	if _, err := l.Create(ctx, "v", 64*mib); err != nil {
		t.Fatal(err)
	}
	img, err := l.Expand(ctx, "v", 128*mib)
	if err != nil || img.Size != 128*mib {
		t.Fatalf("grow: %v %+v", err, img)
	}
	if img, err = l.Expand(ctx, "v", 128*mib); err != nil || img.Size != 128*mib {
		t.Fatalf("same: %v %+v", err, img)
	}
	if _, err := l.Expand(ctx, "v", 64*mib); !errors.Is(err, volerr.ErrInvalid) {
		t.Fatalf("shrink: want volerr.ErrInvalid, got %v", err)
	}
	if got, _ := l.Get(ctx, "v"); got.Size != 128*mib {
		t.Fatalf("after refused shrink: %d", got.Size)
	}
}

// writeAt puts recognisable data at a few offsets, leaving holes between.
func writeAt(t *testing.T, path string, tag string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	for _, off := range []int64{0, 5 * mib, 40*mib + 17} {
		if _, err := f.WriteAt([]byte(fmt.Sprintf("%s@%d", tag, off)), off); err != nil {
			t.Fatal(err)
		}
	}
}

func sameContent(t *testing.T, a, b string, n int64) {
	t.Helper()
	da, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	db, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(da[:n], db[:n]) {
		t.Fatalf("%s and %s differ in the first %d bytes", a, b, n)
	}
}

func TestSnapshotCloneRestore(t *testing.T) {
	ctx := context.Background()
	l, _ := newLocal(t)
	// Sparse images (overcommit), so that copies are seen to stay sparse.
	l = l.Provisioned(Provisioning{OvercommitPercent: 100})
	src, err := l.Create(ctx, "src", 64*mib)
	if err != nil {
		t.Fatal(err)
	}
	writeAt(t, src.Path, "one")
	golden := filepath.Join(t.TempDir(), "golden")
	data, _ := os.ReadFile(src.Path)
	if err := os.WriteFile(golden, data, 0o600); err != nil {
		t.Fatal(err)
	}

	snap, err := l.CreateSnapshot(ctx, "snap", "src")
	if err != nil {
		t.Fatal(err)
	}
	if snap.SourceID != "src" || snap.Size != src.Size || snap.CreatedAt.IsZero() {
		t.Fatalf("snapshot %+v", snap)
	}
	if again, err := l.CreateSnapshot(ctx, "snap", "src"); err != nil || again != snap {
		t.Fatalf("snapshot retry: %v %+v", err, again)
	}
	if _, err := l.CreateSnapshot(ctx, "snap", "other"); !errors.Is(err, ErrExists) {
		t.Fatalf("other source: want ErrExists, got %v", err)
	}
	if _, err := l.CreateSnapshot(ctx, "s2", "missing"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing source: want ErrNotFound, got %v", err)
	}
	// Sparse: the copy allocates about what was written, not 64 MiB.
	if used, _ := allocated(snap.Path); used > mib {
		t.Fatalf("snapshot allocates %d bytes", used)
	}

	writeAt(t, src.Path, "two") // the snapshot must not see this
	restored, err := l.CreateFromSnapshot(ctx, "restored", "snap", 96*mib)
	if err != nil {
		t.Fatal(err)
	}
	if restored.Size != 96*mib {
		t.Fatalf("restored size %d", restored.Size)
	}
	sameContent(t, restored.Path, golden, 64*mib)
	clone, err := l.CreateFromVolume(ctx, "clone", "src", 64*mib)
	if err != nil {
		t.Fatal(err)
	}
	sameContent(t, clone.Path, src.Path, 64*mib)

	// Retries with the same source succeed; another source or size does not.
	if _, err := l.CreateFromSnapshot(ctx, "restored", "snap", 96*mib); err != nil {
		t.Fatalf("restore retry: %v", err)
	}
	if _, err := l.CreateFromVolume(ctx, "restored", "src", 96*mib); !errors.Is(err, ErrExists) {
		t.Fatalf("restore id reused as clone: want ErrExists, got %v", err)
	}
	if _, err := l.Create(ctx, "clone", 64*mib); !errors.Is(err, ErrExists) {
		t.Fatalf("clone id reused as blank: want ErrExists, got %v", err)
	}
	if _, err := l.CreateFromVolume(ctx, "small", "src", mib); !errors.Is(err, volerr.ErrInvalid) {
		t.Fatalf("smaller than source: want volerr.ErrInvalid, got %v", err)
	}
	if _, err := l.CreateFromSnapshot(ctx, "x", "nosnap", mib); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing snapshot: want ErrNotFound, got %v", err)
	}

	snaps, err := l.ListSnapshots(ctx)
	if err != nil || len(snaps) != 1 {
		t.Fatalf("list snapshots: %v %+v", err, snaps)
	}
	for range 2 {
		if err := l.DeleteSnapshot(ctx, "snap"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.GetSnapshot(ctx, "snap"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	// The restored volume is independent of the deleted snapshot.
	sameContent(t, restored.Path, golden, 64*mib)
}

func TestCrashLeftoversRemoved(t *testing.T) {
	dir := t.TempDir()
	l, err := NewLocal(dir, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	// A crash mid-create leaves only a temp file, never the final name.
	tmp := filepath.Join(dir, "volumes", tmpPrefix+"v-123")
	if err := os.WriteFile(tmp, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	if list, _ := l.List(context.Background()); len(list) != 0 {
		t.Fatalf("temp file listed: %+v", list)
	}
	if _, err := NewLocal(dir, testr.New(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("leftover not removed: %v", err)
	}
}

func TestConcurrentDifferentIDs(t *testing.T) {
	ctx := context.Background()
	l, _ := newLocal(t)
	if _, err := l.Create(ctx, "base", 8*mib); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("v%d", i)
			if _, err := l.Create(ctx, id, 8*mib); err != nil {
				errs <- err
			}
			if _, err := l.CreateFromVolume(ctx, id+"-c", "base", 8*mib); err != nil {
				errs <- err
			}
			if _, err := l.CreateSnapshot(ctx, id+"-s", id); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	list, _ := l.List(ctx)
	snaps, _ := l.ListSnapshots(ctx)
	if len(list) != 17 || len(snaps) != 8 {
		t.Fatalf("%d volumes, %d snapshots", len(list), len(snaps))
	}
}

func TestSparseCopyKeepsHoles(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	_ = f.Truncate(32 * mib)
	// Allocated but zero: must not become data in the copy.
	if err := unix.Fallocate(int(f.Fd()), 0, 8*mib, 4*mib); err != nil {
		t.Skipf("fallocate unsupported here: %v", err)
	}
	_, _ = f.WriteAt([]byte("x"), 20*mib)
	_ = f.Close()
	dst, err := os.Create(filepath.Join(dir, "dst"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = dst.Close() }()
	if err := sparseCopy(context.Background(), mustOpen(t, src), dst); err != nil {
		t.Fatal(err)
	}
	sameContent(t, src, dst.Name(), 32*mib)
	if used, _ := allocated(dst.Name()); used > 64*1024 {
		t.Fatalf("copy allocates %d bytes", used)
	}
}

func mustOpen(t *testing.T, p string) *os.File {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

// Usage reads the data dir's real filesystem and sums its images: a
// reserved image's size is promised and allocated, a sparse one's only
// promised, and the filesystem's numbers are statfs's.
func TestUsage(t *testing.T) {
	ctx := context.Background()
	l, dir := newLocal(t)
	if _, err := l.Create(ctx, "reserved", 8*mib); err != nil {
		t.Fatal(err)
	}
	sparse := l.Provisioned(Provisioning{OvercommitPercent: 200})
	if _, err := sparse.Create(ctx, "sparse", 16*mib); err != nil {
		t.Fatal(err)
	}
	u, err := l.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if u.Size != int64(st.Blocks)*st.Bsize || u.Free <= 0 || u.Free > u.Size {
		t.Errorf("filesystem: size %d, free %d; statfs says %d blocks of %d", u.Size, u.Free, st.Blocks, st.Bsize)
	}
	if u.Promised != 24*mib || u.Allocated < 8*mib || u.Allocated >= 24*mib {
		t.Errorf("images: promised %d, allocated %d; want 24 MiB promised, 8 MiB to less than 24 allocated", u.Promised, u.Allocated)
	}
	set, err := NewSet([]string{dir}, nil, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	byDir, err := set.Usage(ctx)
	if err != nil || byDir[dir].Promised != u.Promised {
		t.Errorf("Set.Usage = %v, %v", byDir, err)
	}
}
