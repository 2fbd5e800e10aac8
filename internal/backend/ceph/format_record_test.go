//go:build ceph

package ceph_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/volerr"
)

// wantFormatted fails unless volume id's image records an fsType filesystem.
func wantFormatted(t *testing.T, b interface {
	Format(context.Context, string) (backend.FormatRecord, bool, error)
}, id, fsType string) backend.FormatRecord {
	t.Helper()
	rec, found, err := b.Format(ctxT(t), id)
	if err != nil || !found || rec.FSType != fsType {
		t.Fatalf("format record of %s: %+v, found %v, %v; want %s", id, rec, found, err, fsType)
	}
	return rec
}

// The format record lives in the RBD image's metadata: written once (the
// first record is kept), readable by any client, also while another client
// (a node's blockdev server) holds the image's exclusive lock, and carried
// into clones of the volume and of its snapshots.
func TestFormatRecordOnRealCeph(t *testing.T) {
	b := open(t)
	t.Cleanup(func() { _ = b.Delete(ctxT(t), "fmt-src") })
	ctx := ctxT(t)
	vol, err := b.Create(ctx, "fmt-src", 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	if rec, found, err := b.Format(ctx, "fmt-src"); err != nil || found {
		t.Fatalf("new image: %+v, found %v, %v; want no record", rec, found, err)
	}

	// A node's server holds the exclusive lock, as while a volume is staged.
	node := connectNode(t, cluster.Client, clientKey(t), "berth-fmt-src")
	if err := node.write(bytes.Repeat([]byte("x"), 4096), 0); err != nil {
		t.Fatal(err)
	}
	if owner, err := node.img.LockIsExclusiveOwner(); err != nil || !owner {
		t.Fatalf("the node client owns the lock: %v, %v", owner, err)
	}
	first := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := b.RecordFormat(ctx, "fmt-src", "ext4", first); err != nil {
		t.Fatalf("record while another client holds the lock: %v", err)
	}
	if err := b.RecordFormat(ctx, "fmt-src", "xfs", first.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if rec := wantFormatted(t, b, "fmt-src", "ext4"); !rec.Time.Equal(first) {
		t.Fatalf("record time %s, want the first's %s", rec.Time, first)
	}
	if err := node.write(bytes.Repeat([]byte("y"), 4096), 4096); err != nil {
		t.Fatalf("the lock owner writes after the record: %v", err)
	}
	// Any client, any tool, reads it from the image.
	if got := rbd(t, "image-meta", "get", vol.Path, "berth.formatted"); !strings.Contains(got, `"fsType":"ext4"`) {
		t.Fatalf("rbd image-meta get: %q", got)
	}

	// Copies: a restore of a snapshot and a clone of the volume.
	if _, err := b.CreateSnapshot(ctx, "fmt-snap", "fmt-src"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.DeleteSnapshot(ctxT(t), "fmt-snap") })
	if _, err := b.CreateFromSnapshot(ctx, "fmt-restore", "fmt-snap", 8<<20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Delete(ctxT(t), "fmt-restore") })
	wantFormatted(t, b, "fmt-restore", "ext4")
	if _, err := b.CreateFromVolume(ctx, "fmt-clone", "fmt-src", 8<<20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Delete(ctxT(t), "fmt-clone") })
	wantFormatted(t, b, "fmt-clone", "ext4")

	// A corrupt record still says "formatted".
	rbd(t, "image-meta", "set", vol.Path, "berth.formatted", "garbage")
	wantFormatted(t, b, "fmt-src", "unknown")

	if err := b.RecordFormat(ctx, "fmt-src", "", first); !errors.Is(err, volerr.ErrInvalid) {
		t.Fatalf("record without fs type: %v", err)
	}
	if _, found, err := b.Format(ctx, "missing"); !errors.Is(err, backend.ErrNotFound) || found {
		t.Fatalf("record of a missing image: found %v, %v; want ErrNotFound", found, err)
	}
}

// A record that cannot be read (every OSD stopped) is an error when ctx
// ends, never "no record".
func TestFormatRecordUnreadableIsAnError(t *testing.T) {
	b := open(t)
	if _, err := b.Create(ctxT(t), "fmt-stall", 8<<20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Delete(ctxT(t), "fmt-stall") })
	ctx, thaw := stalled(t)
	rec, found, err := b.Format(ctx, "fmt-stall")
	if !errors.Is(err, context.DeadlineExceeded) || found {
		t.Fatalf("read with the OSDs stopped: %+v, found %v, %v; want DeadlineExceeded", rec, found, err)
	}
	t.Logf("read with the OSDs stopped: %v", err)
	thaw()
	// The abandoned read ends once the OSDs answer again, before Close.
	deadline := time.Now().Add(90 * time.Second)
	for {
		_, found, err := b.Format(ctxT(t), "fmt-stall")
		if err == nil && !found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the OSDs resumed: found %v, %v", found, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
