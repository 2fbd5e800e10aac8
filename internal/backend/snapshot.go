package backend

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Snapshot is a point-in-time copy of a volume's image. Its content is only
// crash-consistent unless the caller quiesced the filesystem first.
type Snapshot struct {
	ID        string
	SourceID  string
	Path      string
	Size      int64
	CreatedAt time.Time
}

const volumeSourcePrefix = "volume:"

func allocated(path string) (int64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", path, err)
	}
	return st.Blocks * 512, nil
}

func (l *Local) snapshotPath(id string) string { return filepath.Join(l.snaps, id+imageExt) }

// CreateSnapshot copies a volume into a snapshot (reflink where possible,
// else sparse). The same snapID and source again returns the existing one;
// another source is ErrExists.
func (l *Local) CreateSnapshot(ctx context.Context, snapID, sourceID string) (Snapshot, error) {
	if err := ValidateID(snapID); err != nil {
		return Snapshot{}, err
	}
	if s, err := l.GetSnapshot(ctx, snapID); err == nil {
		if s.SourceID != sourceID {
			return Snapshot{}, fmt.Errorf("snapshot %s is of %q, asked %q: %w", snapID, s.SourceID, sourceID, ErrExists)
		}
		return s, nil
	} else if !errors.Is(err, ErrNotFound) {
		return Snapshot{}, err
	}
	src, err := l.Get(ctx, sourceID)
	if err != nil {
		return Snapshot{}, fmt.Errorf("snapshot source: %w", err)
	}
	used, err := allocated(src.Path)
	if err != nil {
		return Snapshot{}, err
	}
	// A sparse copy needs at most the source's allocated blocks.
	release, err := l.book.take("snapshot/"+snapID, used, l.Capacity)
	if err != nil {
		return Snapshot{}, err
	}
	defer release()
	final := l.snapshotPath(snapID)
	err = writeAtomic(l.snaps, final, snapID, func(tmp *os.File) error {
		if err := l.copyFrom(ctx, sourceID, src.Path, tmp); err != nil {
			return err
		}
		return unix.Fsetxattr(int(tmp.Fd()), xattrSource, []byte(volumeSourcePrefix+sourceID), 0)
	})
	if errors.Is(err, ErrExists) {
		return l.GetSnapshot(ctx, snapID)
	}
	if err != nil {
		return Snapshot{}, fmt.Errorf("create snapshot %s: %w", snapID, err)
	}
	l.log.Info("created snapshot", "id", snapID, "source", sourceID)
	return l.GetSnapshot(ctx, snapID)
}

// GetSnapshot returns a snapshot; ErrNotFound when missing.
func (l *Local) GetSnapshot(_ context.Context, id string) (Snapshot, error) {
	p, fi, err := statImage("snapshot", id, l.snapshotPath)
	if err != nil {
		return Snapshot{}, err
	}
	src, err := readSource(p)
	if err != nil {
		return Snapshot{}, err
	}
	return Snapshot{
		ID:       id,
		SourceID: strings.TrimPrefix(src, volumeSourcePrefix),
		Path:     p,
		Size:     fi.Size(),
		// The image is never written after its rename, so mtime is the
		// moment the copy finished.
		CreatedAt: fi.ModTime(),
	}, nil
}

// ListSnapshots returns all snapshots, in name order.
func (l *Local) ListSnapshots(ctx context.Context) ([]Snapshot, error) {
	return listAll(l.snaps, func(id string) (Snapshot, error) { return l.GetSnapshot(ctx, id) })
}

// DeleteSnapshot removes a snapshot; a missing one is not an error.
func (l *Local) DeleteSnapshot(_ context.Context, id string) error {
	return l.removeImage("snapshot", id, l.snapshotPath)
}
