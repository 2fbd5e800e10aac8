package backend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/volerr"
)

// xattrFormatted marks an image that holds a filesystem. It is an xattr on
// the image, not a file beside it, so it lives and dies with the image: a
// deleted and re-created volume can never inherit a stale record, and a
// copy (snapshot, clone) starts without one. Read it with
// `getfattr -n user.berth.formatted <image>`.
const xattrFormatted = "user.berth.formatted"

// FormatRecord says that a volume's image holds a filesystem: stage never
// formats it again.
type FormatRecord struct {
	FSType string    `json:"fsType"`
	Time   time.Time `json:"time"`
}

// Encode is the record as stored: JSON, the time in UTC to the second.
func (r FormatRecord) Encode() ([]byte, error) {
	return json.Marshal(FormatRecord{FSType: r.FSType, Time: r.Time.UTC().Truncate(time.Second)})
}

// DecodeFormatRecord reads a stored record. One that does not parse still
// says "formatted" (type "unknown", ok false): only its detail is lost, and
// refusing mkfs is the safe reading.
func DecodeFormatRecord(b []byte) (rec FormatRecord, ok bool) {
	if err := json.Unmarshal(b, &rec); err != nil || rec.FSType == "" {
		return FormatRecord{FSType: "unknown"}, false
	}
	return rec, true
}

// RecordFormat marks a volume's image as holding a filesystem of fsType, and
// fsyncs the image so the mark survives a crash. An existing mark is kept.
func (l *Local) RecordFormat(ctx context.Context, id, fsType string, at time.Time) error {
	img, err := l.Get(ctx, id)
	if err != nil {
		return err
	}
	if fsType == "" {
		return fmt.Errorf("record format of %s: fs type missing: %w", id, volerr.ErrInvalid)
	}
	b, err := FormatRecord{FSType: fsType, Time: at}.Encode()
	if err != nil {
		return err
	}
	f, err := os.OpenFile(img.Path, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", img.Path, err)
	}
	defer func() { _ = f.Close() }()
	err = unix.Fsetxattr(int(f.Fd()), xattrFormatted, b, unix.XATTR_CREATE)
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("record format on %s: %w", img.Path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", img.Path, err)
	}
	l.log.Info("recorded format", "id", id, "fsType", fsType)
	return nil
}

// Format returns the format record of a volume's image; found is false for
// an image that has none.
func (l *Local) Format(ctx context.Context, id string) (rec FormatRecord, found bool, err error) {
	img, err := l.Get(ctx, id)
	if err != nil {
		return FormatRecord{}, false, err
	}
	buf := make([]byte, 512)
	n, err := unix.Getxattr(img.Path, xattrFormatted, buf)
	if errors.Is(err, unix.ENODATA) {
		return FormatRecord{}, false, nil
	}
	if err != nil {
		return FormatRecord{}, false, fmt.Errorf("read format record of %s: %w", img.Path, err)
	}
	rec, ok := DecodeFormatRecord(buf[:n])
	if !ok {
		l.log.Info("format record does not parse; treating the image as formatted", "id", id, "record", string(buf[:n]))
	}
	return rec, true, nil
}
