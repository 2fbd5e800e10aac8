package imagefile

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func newImage(t *testing.T, size int64, direct bool) (*Image, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "img")
	if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	img, err := Open(path, direct)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = img.Close() })
	return img, path
}

// TestSizeFollowsWritesAndGrowth: the size the server reports tracks writes
// past the end, a truncate, and a backend growing the file behind it.
func TestSizeFollowsWritesAndGrowth(t *testing.T) {
	img, path := newImage(t, 4096, true)
	if img.Size() != 4096 {
		t.Fatalf("Size = %d, want 4096", img.Size())
	}
	if _, err := img.WriteAt([]byte("abc"), 8190); err != nil {
		t.Fatal(err)
	}
	if img.Size() != 8193 {
		t.Fatalf("Size after write past end = %d, want 8193", img.Size())
	}
	got := make([]byte, 3)
	if n, err := img.ReadAt(got, 8190); err != nil || n != 3 || string(got) != "abc" {
		t.Fatalf("ReadAt = %d %q %v", n, got, err)
	}
	if err := os.Truncate(path, 1<<20); err != nil {
		t.Fatal(err)
	}
	if size, err := img.Restat(); err != nil || size != 1<<20 {
		t.Fatalf("Restat = %d, %v; want %d", size, err, 1<<20)
	}
	if err := img.Truncate(2 << 20); err != nil || img.Size() != 2<<20 {
		t.Fatalf("Truncate: size %d, %v", img.Size(), err)
	}
	if err := img.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestReadAtEnd: a read across the end is short, not an error.
func TestReadAtEnd(t *testing.T) {
	img, _ := newImage(t, 100, false)
	buf := make([]byte, 64)
	if n, err := img.ReadAt(buf, 80); err != nil || n != 20 {
		t.Fatalf("ReadAt across end = %d, %v; want 20, nil", n, err)
	}
}

// TestRangeRefused: offsets the kernel never sends fail with EINVAL.
func TestRangeRefused(t *testing.T) {
	img, _ := newImage(t, 100, false)
	for _, off := range []int64{-1, 1<<63 - 2} {
		if _, err := img.WriteAt(make([]byte, 4), off); !errors.Is(err, unix.EINVAL) {
			t.Errorf("WriteAt(off %d) = %v, want EINVAL", off, err)
		}
		if _, err := img.ReadAt(make([]byte, 4), off); !errors.Is(err, unix.EINVAL) {
			t.Errorf("ReadAt(off %d) = %v, want EINVAL", off, err)
		}
	}
}

func TestOpenRefusesNonRegular(t *testing.T) {
	if _, err := Open(t.TempDir(), false); err == nil {
		t.Fatal("Open of a directory succeeded")
	}
}
