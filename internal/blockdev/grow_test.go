package blockdev_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/blockdev"
)

// TestImageGrownBehindServer grows the image behind a running server, as
// the backend does on expansion: the FUSE file must show the new size, and
// so the loop device on it once its capacity is refreshed.
func TestImageGrownBehindServer(t *testing.T) {
	for _, passthrough := range []bool{false, true} {
		t.Run(mode(passthrough), func(t *testing.T) { testImageGrown(t, passthrough) })
	}
}

func testImageGrown(t *testing.T, passthrough bool) {
	needKernel(t)
	r := newRig(t, 64<<20)
	r.passthrough = passthrough
	r.startServer()
	file := filepath.Join(r.mountpoint, blockdev.FileName)
	r.loop = run(t, "losetup", "--direct-io=on", "--find", "--show", file)
	const want = 128 << 20
	if err := os.Truncate(r.image, want); err != nil {
		t.Fatal(err)
	}
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, file, unix.AT_STATX_FORCE_SYNC, unix.STATX_SIZE, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != want {
		t.Fatalf("%s: %d bytes after the image grew, want %d", file, st.Size, want)
	}
	run(t, "losetup", "--set-capacity", r.loop)
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(r.loop), "size"))
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); n*512 != want {
		t.Fatalf("loop device %s: %d bytes after refresh, want %d", r.loop, n*512, want)
	}
}
