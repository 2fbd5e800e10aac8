package backend

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"
)

// TestRootReflinkOnXFS runs the backend on a real xfs (reflink on by
// default) and checks that a snapshot and a clone share extents: the
// filesystem's used space does not grow by the copied data.
func TestRootReflinkOnXFS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop device and mount for an xfs data dir")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("needs loop devices: %v", err)
	}
	mnt := newFS(t, "320M", "mkfs.xfs", "-q", "-f")

	ctx := context.Background()
	l, err := NewLocal(filepath.Join(mnt, "berth"), testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	// Sparse images: a reserved clone allocates its holes, which would
	// hide whether the data was shared.
	l = l.Provisioned(Provisioning{OvercommitPercent: 100})
	src, err := l.Create(ctx, "src", 64*mib)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("berth"), 8*mib/5)
	if err := os.WriteFile(src.Path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	before := usedBytes(t, mnt)
	if _, err := l.CreateSnapshot(ctx, "snap", "src"); err != nil {
		t.Fatal(err)
	}
	clone, err := l.CreateFromVolume(ctx, "clone", "src", 64*mib)
	if err != nil {
		t.Fatal(err)
	}
	if grown := usedBytes(t, mnt) - before; grown > mib {
		t.Fatalf("copies used %d bytes: not reflinked", grown)
	}
	got, _ := os.ReadFile(clone.Path)
	if !bytes.Equal(got[:len(data)], data) {
		t.Fatal("clone content differs")
	}
}

func usedBytes(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}
