package mount

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRootFormatKeepsReservedSpace (F12): mkfs on a loop device over a
// fully allocated image does not discard it. A discard punches holes in
// the image file, so a reserved local volume would be sparse again once
// formatted and a neighbour filling the disk could run it out of space.
func TestRootFormatKeepsReservedSpace(t *testing.T) {
	for _, tc := range []struct {
		fs   string
		size int64
	}{{"ext4", 64 * mib}, {"xfs", 320 * mib}} {
		t.Run(tc.fs, func(t *testing.T) {
			e := newRootEnv(t)
			img := e.image(t, "vol", tc.size)
			f, err := os.OpenFile(img, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := unix.Fallocate(int(f.Fd()), 0, 0, tc.size); err != nil {
				_ = f.Close()
				t.Skipf("the test folder's filesystem cannot preallocate: %v", err)
			}
			_ = f.Close()
			req := e.stage(t, img, StageRequest{VolumeID: "v", FSType: tc.fs})
			e.unstage(t, req.StagingPath)
			var st unix.Stat_t
			if err := unix.Stat(img, &st); err != nil {
				t.Fatal(err)
			}
			if got := st.Blocks * 512; got < tc.size {
				t.Fatalf("after mkfs.%s the image holds %d of its %d bytes: discarded", tc.fs, got, tc.size)
			}
		})
	}
}
