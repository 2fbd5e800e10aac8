package mount

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/volerr"
)

// blankRegion is how much of each end of a device must read as zeros.
// Filesystems and volume managers keep their signatures there: xfs at 0,
// ext2/3/4 at 1 KiB, LVM in the first sectors, btrfs at 64 KiB, GPT's
// backup header and md 1.0 metadata in the last sectors.
const blankRegion = 1 << 20

// blankTimeout bounds the blank check: a read from a device whose server
// died may hang.
const blankTimeout = time.Minute

// checkBlank is the rule for "nothing on this volume can be data", which
// is what allows a format after blkid found nothing:
//   - the image behind the device, when there is one, reads as all zeros.
//     SEEK_DATA skips holes, so a fresh sparse image (no extents at all)
//     costs no read, and an image that holds data shows a non-zero byte
//     within its first extent;
//   - the device itself reads back its first and last MiB, all zeros. This
//     proves the device is readable (a read error fails the stage, it never
//     counts as blank) and covers devices without an image file.
func checkBlank(ctx context.Context, dev, image string) error {
	ctx, cancel := context.WithTimeout(ctx, blankTimeout)
	defer cancel()
	done := make(chan error, 1)
	// A read from a hung device cannot be interrupted; the goroutine ends
	// when the read does, and the stage fails at the deadline meanwhile.
	go func() {
		if image != "" {
			if err := fileZero(ctx, image); err != nil {
				done <- err
				return
			}
		}
		done <- deviceEndsZero(dev)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("check that %s is blank: %w", dev, ctx.Err())
	}
}

// fileZero fails unless every data extent of path reads as zeros.
func fileZero(ctx context.Context, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open image %s: %w", path, err)
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat image %s: %w", path, err)
	}
	buf := make([]byte, blankRegion)
	for off := int64(0); off < fi.Size(); {
		start, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole remains
		}
		if err != nil {
			return fmt.Errorf("seek data in %s: %w", path, err)
		}
		end, err := unix.Seek(int(f.Fd()), start, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole in %s: %w", path, err)
		}
		for pos := start; pos < end; {
			if err := ctx.Err(); err != nil {
				return err
			}
			n, err := f.ReadAt(buf[:min(int64(len(buf)), end-pos)], pos)
			if err != nil && !errors.Is(err, io.EOF) {
				return fmt.Errorf("read image %s at %d: %w", path, pos, err)
			}
			if at := firstNonZero(buf[:n]); at >= 0 {
				return fmt.Errorf("image %s holds data at byte %d: %w", path, pos+int64(at), ErrHoldsData)
			}
			if n == 0 {
				break
			}
			pos += int64(n)
		}
		off = end
	}
	return nil
}

// deviceEndsZero fails unless dev reads back, as zeros, its first and last
// blankRegion bytes.
func deviceEndsZero(dev string) error {
	f, err := os.Open(dev)
	if err != nil {
		return fmt.Errorf("open %s: %w", dev, err)
	}
	defer func() { _ = f.Close() }()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return fmt.Errorf("size of %s: %w", dev, err)
	}
	if size == 0 {
		return fmt.Errorf("%s has size 0: %w", dev, volerr.ErrInvalid)
	}
	buf := make([]byte, min(size, blankRegion))
	for _, off := range []int64{0, size - int64(len(buf))} {
		if _, err := f.ReadAt(buf, off); err != nil {
			return fmt.Errorf("read %s at %d: %w", dev, off, err)
		}
		if at := firstNonZero(buf); at >= 0 {
			return fmt.Errorf("%s holds data at byte %d that blkid does not name: %w", dev, off+int64(at), ErrHoldsData)
		}
	}
	return nil
}

func firstNonZero(b []byte) int {
	for i, c := range b {
		if c != 0 {
			return i
		}
	}
	return -1
}
