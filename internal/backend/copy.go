package backend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// copyChunk bounds each read so that context cancellation is seen promptly.
const copyChunk = 1 << 20

// copyFile fills dst (empty, same filesystem dir as the data dir) with src's
// content: a reflink when the filesystem shares extents, else a sparse copy
// that writes only non-zero data. It never writes a full dense copy.
// A reflink is atomic; a sparse copy reads chunk by chunk, so it runs only
// when stable says nothing writes src meanwhile (else ErrSourceInUse).
func copyFile(ctx context.Context, srcPath string, dst *os.File, stable bool) error {
	src, err := os.Open(srcPath)
	if err != nil {
		return fmt.Errorf("open source: %w", err)
	}
	defer func() { _ = src.Close() }()
	err = unix.IoctlFileClone(int(dst.Fd()), int(src.Fd()))
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EXDEV) &&
		!errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOTTY) {
		return fmt.Errorf("reflink: %w", err)
	}
	if !stable {
		return fmt.Errorf("the data dir cannot reflink, and a chunked copy of a volume staged without a filesystem to freeze would be torn: %w", ErrSourceInUse)
	}
	return sparseCopy(ctx, src, dst)
}

func sparseCopy(ctx context.Context, src, dst *os.File) error {
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	// Holes in dst read as zeros, so only data needs writing.
	if err := dst.Truncate(size); err != nil {
		return err
	}
	buf := make([]byte, copyChunk)
	var off int64
	for off < size {
		start, err := unix.Seek(int(src.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole remains
		}
		if err != nil {
			return fmt.Errorf("seek data: %w", err)
		}
		end, err := unix.Seek(int(src.Fd()), start, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole: %w", err)
		}
		if err := copyRange(ctx, src, dst, start, end, buf); err != nil {
			return err
		}
		off = end
	}
	return nil
}

// copyRange copies [start,end) chunk by chunk, skipping all-zero chunks
// (allocated but unwritten extents, freshly zeroed blocks) to keep dst sparse.
func copyRange(ctx context.Context, src, dst *os.File, start, end int64, buf []byte) error {
	for pos := start; pos < end; {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := int64(len(buf))
		if end-pos < n {
			n = end - pos
		}
		got, err := src.ReadAt(buf[:n], pos)
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("read at %d: %w", pos, err)
		}
		if got == 0 {
			return nil
		}
		chunk := buf[:got]
		if !isZero(chunk) {
			if _, err := dst.WriteAt(chunk, pos); err != nil {
				return fmt.Errorf("write at %d: %w", pos, err)
			}
		}
		pos += int64(got)
	}
	return nil
}

func isZero(b []byte) bool {
	var zero [4096]byte
	for len(b) > 0 {
		n := min(len(b), len(zero))
		if !bytes.Equal(b[:n], zero[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}
