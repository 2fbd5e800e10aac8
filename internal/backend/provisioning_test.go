package backend

import (
	"context"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr/testr"

	"github.com/berth-io/berth/internal/testenv"
)

func TestPromisable(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		percent                   int32
		free, promised, allocated int64
		want                      int64
	}{
		{"reserved images: the free space", 0, 100, 60, 60, 100},
		{"sparse images made before reservation count for what they may take", 0, 100, 60, 10, 50},
		{"promised beyond the space: nothing", 0, 10, 200, 50, 0},
		{"overcommit 100: the given space less the promises", 100, 100, 60, 10, 50},
		{"overcommit 300: three times the given space", 300, 100, 60, 10, 270},
		{"overcommit of a petabyte", 10000, 1 << 50, 0, 0, 100 << 50},
		{"overcommit past int64 saturates", 10000, 1 << 60, 0, 0, math.MaxInt64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Provisioning{OvercommitPercent: tc.percent}
			if got := p.promisable(tc.free, tc.promised, tc.allocated); got != tc.want {
				t.Fatalf("promisable(%d, %d, %d) with %v = %d, want %d", tc.free, tc.promised, tc.allocated, p, got, tc.want)
			}
		})
	}
}

// TestSpaceBookRefusesPromisesUnderWay: two creates at once cannot both
// take the last of the space.
func TestSpaceBookRefusesPromisesUnderWay(t *testing.T) {
	b := &spaceBook{pending: map[string]int64{}}
	capacity := func(context.Context) (int64, error) { return 100, nil }
	release, err := b.take("a", 60, capacity)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.take("b", 60, capacity); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("second promise beside one under way: want ErrNoSpace, got %v", err)
	}
	release()
	if _, err := b.take("b", 60, capacity); err != nil {
		t.Fatalf("after release: %v", err)
	}
}

// TestRootReservedImagesKeepTheirSpace (F12) runs the backend on a small
// real ext4: with images reserved, capacity is what is left after them, a
// volume past it is refused, and one volume filled to its size leaves its
// neighbour's writes unharmed. Before reservation the third create was
// accepted (each compared to the free space alone) and filling the first
// volume ran the second out of space. With overcommit, sparse images may
// promise the percent asked and no more.
func TestRootReservedImagesKeepTheirSpace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop device and mount for a small ext4 data dir")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("needs loop devices: %v", err)
	}
	mnt := newFS(t, "96M", "mkfs.ext4", "-q", "-F")
	ctx := context.Background()
	l, err := NewLocal(filepath.Join(mnt, "berth"), testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	free, err := l.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	size := free * 2 / 5 / imageAlign * imageAlign
	a, err := l.Create(ctx, "a", size)
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.Create(ctx, "b", size)
	if err != nil {
		t.Fatal(err)
	}
	left, err := l.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if left > free-2*size {
		t.Fatalf("capacity after two reserved images of %d: %d, want at most %d", size, left, free-2*size)
	}
	if _, err := l.Create(ctx, "c", size); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("a third image past what is left: want ErrNoSpace, got %v", err)
	}
	fill(t, a.Path, a.Size)
	fill(t, b.Path, b.Size) // ENOSPC here without reservation

	// Growing a reserved image reserves the growth, and past what is left
	// it is refused.
	if _, err := l.Expand(ctx, "b", size+left+(1<<20)); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("growth past what is left: want ErrNoSpace, got %v", err)
	}
	// A reservation the filesystem refuses leaves the size as it was, so
	// that the retry of an expansion grows (and reserves) again.
	if err := growFile(b.Path, 1<<40, true); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("growFile past the filesystem: %v, want ErrNoSpace", err)
	}
	if img, err := l.Get(ctx, "b"); err != nil || img.Size != b.Size {
		t.Fatalf("after a refused growth: %+v, %v; want size %d", img, err, b.Size)
	}
	for _, id := range []string{"a", "b"} {
		if err := l.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}

	// Overcommit 200%: sparse images up to twice the space, no further.
	over := l.Provisioned(Provisioning{OvercommitPercent: 200})
	given, err := over.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if given < 2*free-(4<<20) {
		t.Fatalf("overcommit 200%%: capacity %d, want about %d", given, 2*free)
	}
	big, err := over.Create(ctx, "big", given/imageAlign*imageAlign-imageAlign)
	if err != nil {
		t.Fatal(err)
	}
	if used, _ := allocated(big.Path); used != 0 {
		t.Fatalf("overcommitted image not sparse: %d bytes allocated", used)
	}
	if _, err := over.Create(ctx, "more", 1<<20); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("past 200%%: want ErrNoSpace, got %v", err)
	}
}

// newFS mounts a new filesystem of size, made by the mkfs command line
// (the device is added last), on a loop device for one test.
func newFS(t *testing.T, size string, mkfs ...string) string {
	t.Helper()
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "mnt")
	testenv.Run(t, "truncate", "-s", size, img)
	dev := testenv.Run(t, "losetup", "--find", "--show", img)
	t.Cleanup(func() { _, _ = exec.Command("losetup", "-d", dev).CombinedOutput() })
	testenv.Run(t, mkfs[0], append(mkfs[1:], dev)...)
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	testenv.Run(t, "mount", dev, mnt)
	t.Cleanup(func() { _, _ = exec.Command("umount", mnt).CombinedOutput() })
	return mnt
}

// fill writes an image to its full size, as a workload filling its
// volume does, and syncs.
func fill(t *testing.T, path string, size int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	for off := int64(0); off < size; off += int64(len(buf)) {
		n := min(int64(len(buf)), size-off)
		if _, err := f.WriteAt(buf[:n], off); err != nil {
			t.Fatalf("fill %s at %d: %v", path, off, err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("sync %s: %v", path, err)
	}
}
