package backend

import (
	"context"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/volerr"
)

func TestFormatRecord(t *testing.T) {
	ctx := context.Background()
	l, _ := newLocal(t)
	img, err := l.Create(ctx, "vol", 64*mib)
	if err != nil {
		t.Fatal(err)
	}
	if _, found, err := l.Format(ctx, "vol"); err != nil || found {
		t.Fatalf("fresh image: found %v, %v; want no record", found, err)
	}
	first := time.Date(2026, 11, 23, 2, 0, 0, 0, time.UTC)
	if err := l.RecordFormat(ctx, "vol", "ext4", first); err != nil {
		t.Fatal(err)
	}
	// The first record stays: a later stage re-records nothing.
	if err := l.RecordFormat(ctx, "vol", "xfs", first.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	rec, found, err := l.Format(ctx, "vol")
	if err != nil || !found || rec.FSType != "ext4" || !rec.Time.Equal(first) {
		t.Fatalf("record %+v found %v, %v; want ext4 at %v", rec, found, err, first)
	}

	// Copies start unrecorded (their Volume's source forbids a format).
	if _, err := l.CreateSnapshot(ctx, "snap", "vol"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CreateFromVolume(ctx, "clone", "vol", 64*mib); err != nil {
		t.Fatal(err)
	}
	if _, found, _ := l.Format(ctx, "clone"); found {
		t.Error("a clone inherited the format record")
	}

	// A record that does not parse still reads as formatted.
	if err := unix.Setxattr(img.Path, xattrFormatted, []byte("garbage"), 0); err != nil {
		t.Fatal(err)
	}
	if _, found, err := l.Format(ctx, "vol"); err != nil || !found {
		t.Errorf("garbled record: found %v, %v; want found", found, err)
	}
	if err := l.RecordFormat(ctx, "vol", "", first); !errors.Is(err, volerr.ErrInvalid) {
		t.Errorf("empty fs type: %v, want volerr.ErrInvalid", err)
	}
	if _, _, err := l.Format(ctx, "missing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing volume: %v, want ErrNotFound", err)
	}
}
