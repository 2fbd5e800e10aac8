// Package backend stores volumes. The local backend keeps each volume as a
// sparse image file in a data directory on the node.
package backend

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/atomicfile"
	"github.com/berth-io/berth/internal/volerr"
	"github.com/berth-io/berth/internal/volid"
)

// Sentinel errors, each of one volerr kind; callers decide with errors.Is.
// Returned errors wrap them with detail. A bad argument is volerr.ErrInvalid.
var (
	ErrNotFound = volerr.New(volerr.ErrNotFound, "not found")
	// ErrExists: the ID is taken by an image of another size or source.
	ErrExists  = volerr.New(volerr.ErrExists, "already exists with other parameters")
	ErrNoSpace = volerr.New(volerr.ErrNoSpace, "not enough space")
)

// Image is a volume's backing file.
type Image struct {
	ID   string
	Path string
	Size int64
}

// Local is the file-image backend. Per-ID serialisation is the caller's job;
// calls on different IDs never share a file name, so they cannot corrupt one
// another.
type Local struct {
	dir     string
	volumes string
	snaps   string
	log     logr.Logger
	// quiescer holds a source volume still while it is copied; nil: none.
	quiescer Quiescer
	// prov is how much space images may promise (Provisioned sets it).
	prov Provisioning
	// book holds the space promised by creates and expands under way, so
	// that two at once cannot both take the last of it.
	book *spaceBook
}

const (
	// imageAlign: loop devices and filesystems want whole blocks.
	imageAlign = 4096
	imageExt   = ".img"
	tmpPrefix  = ".tmp-"
	// xattrSource records where an image's content came from, so that a
	// retried create with another source is told apart from a true retry.
	xattrSource = "user.berth.source"
)

// NewLocal opens (creating if needed) a data dir and removes temp files a
// crash left behind.
func NewLocal(dir string, log logr.Logger) (*Local, error) {
	if dir == "" {
		return nil, fmt.Errorf("data dir: %w", volerr.ErrInvalid)
	}
	l := &Local{
		dir:     dir,
		volumes: filepath.Join(dir, "volumes"),
		snaps:   filepath.Join(dir, "snapshots"),
		log:     log,
		book:    &spaceBook{pending: map[string]int64{}},
	}
	for _, d := range []string{l.volumes, l.snaps} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
		if err := removeTemps(d, log); err != nil {
			return nil, err
		}
	}
	if err := probeXattr(l.volumes); err != nil {
		return nil, fmt.Errorf("data dir %s must support user xattrs: %w", dir, err)
	}
	return l, nil
}

func removeTemps(dir string, log logr.Logger) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			p := filepath.Join(dir, e.Name())
			log.Info("removing leftover temp image", "path", p)
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("remove %s: %w", p, err)
			}
		}
	}
	return nil
}

func probeXattr(dir string) error {
	f, err := os.CreateTemp(dir, tmpPrefix+"probe-")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(f.Name()) }()
	defer func() { _ = f.Close() }()
	return unix.Fsetxattr(int(f.Fd()), xattrSource, []byte("probe"), 0)
}

// ValidateID applies the one volume ID rule (internal/volid), which also
// keeps an ID from escaping the data dir.
func ValidateID(id string) error {
	return volid.Valid(id)
}

func alignSize(size int64) (int64, error) {
	if size <= 0 {
		return 0, fmt.Errorf("size %d: %w", size, volerr.ErrInvalid)
	}
	return (size + imageAlign - 1) / imageAlign * imageAlign, nil
}

func (l *Local) volumePath(id string) string { return filepath.Join(l.dir, VolumeFile(id)) }

// VolumeFile is where volume id's image lies below its data dir. It is also
// the tail that sysfs names for a loop device on the image once the data
// dir is out of the reader's reach (a deleted StorageCluster's folder, no
// longer mounted into the agent): the kernel names the file from the root
// of the mount it is on.
func VolumeFile(id string) string { return filepath.Join("volumes", id+imageExt) }

// Create makes an empty sparse image of at least size bytes (rounded up to
// 4 KiB). The same id and size again returns the existing image.
func (l *Local) Create(ctx context.Context, id string, size int64) (Image, error) {
	return l.create(ctx, id, size, "", nil)
}

// CreateFromSnapshot makes a volume with a snapshot's content, grown to size.
func (l *Local) CreateFromSnapshot(ctx context.Context, id, snapshotID string, size int64) (Image, error) {
	if err := ValidateID(snapshotID); err != nil {
		return Image{}, err
	}
	src := l.snapshotPath(snapshotID)
	return l.create(ctx, id, size, "snapshot:"+snapshotID, &src)
}

// CreateFromVolume clones a volume into a new one, grown to size.
func (l *Local) CreateFromVolume(ctx context.Context, id, sourceID string, size int64) (Image, error) {
	if err := ValidateID(sourceID); err != nil {
		return Image{}, err
	}
	src := l.volumePath(sourceID)
	return l.create(ctx, id, size, volumeSourcePrefix+sourceID, &src)
}

func (l *Local) create(ctx context.Context, id string, size int64, source string, srcPath *string) (Image, error) {
	if err := ValidateID(id); err != nil {
		return Image{}, err
	}
	size, err := alignSize(size)
	if err != nil {
		return Image{}, err
	}
	final := l.volumePath(id)
	if img, err := l.Get(ctx, id); err == nil {
		if err := matchExisting(final, img.Size, size, source); err != nil {
			return Image{}, err
		}
		return img, nil
	} else if !errors.Is(err, ErrNotFound) {
		return Image{}, err
	}
	// A volume's image may be in use; a snapshot's never changes.
	var sourceVolume string
	if v, ok := strings.CutPrefix(source, volumeSourcePrefix); ok {
		sourceVolume = v
	}
	var srcSize int64
	if srcPath != nil {
		fi, err := os.Stat(*srcPath)
		if errors.Is(err, os.ErrNotExist) {
			return Image{}, fmt.Errorf("source %s: %w", source, ErrNotFound)
		} else if err != nil {
			return Image{}, fmt.Errorf("stat source %s: %w", source, err)
		}
		srcSize = fi.Size()
		if size < srcSize {
			return Image{}, fmt.Errorf("size %d smaller than source %s (%d): %w", size, source, srcSize, volerr.ErrInvalid)
		}
	}
	release, err := l.book.take(id, size, l.Capacity)
	if err != nil {
		return Image{}, err
	}
	defer release()
	err = writeAtomic(l.volumes, final, id, func(tmp *os.File) error {
		if srcPath != nil {
			if err := l.copyFrom(ctx, sourceVolume, *srcPath, tmp); err != nil {
				return err
			}
		}
		if err := tmp.Truncate(size); err != nil {
			return fmt.Errorf("size image: %w", err)
		}
		if l.prov.Reserve() {
			if err := reserve(tmp, size); err != nil {
				return err
			}
		}
		if source != "" {
			if err := unix.Fsetxattr(int(tmp.Fd()), xattrSource, []byte(source), 0); err != nil {
				return fmt.Errorf("record source: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return Image{}, fmt.Errorf("create volume %s: %w", id, err)
	}
	l.log.Info("created volume", "id", id, "size", size, "source", source, "provisioning", l.prov.String())
	return Image{ID: id, Path: final, Size: size}, nil
}

// matchExisting decides whether an existing image satisfies a repeated create.
func matchExisting(path string, have, want int64, source string) error {
	if have != want {
		return fmt.Errorf("%s has size %d, asked %d: %w", path, have, want, ErrExists)
	}
	got, err := readSource(path)
	if err != nil {
		return err
	}
	if got != source {
		return fmt.Errorf("%s has source %q, asked %q: %w", path, got, source, ErrExists)
	}
	return nil
}

func readSource(path string) (string, error) {
	buf := make([]byte, 512)
	n, err := unix.Getxattr(path, xattrSource, buf)
	if errors.Is(err, unix.ENODATA) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read source of %s: %w", path, err)
	}
	return string(buf[:n]), nil
}

// writeAtomic fills a temp file in dir and renames it to final only once it
// is complete and synced, so a crash never leaves a half image under final.
func writeAtomic(dir, final, id string, fill func(*os.File) error) (err error) {
	tmp, err := os.CreateTemp(dir, tmpPrefix+id+"-")
	if err != nil {
		return fmt.Errorf("temp file: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
		if errors.Is(err, unix.ENOSPC) && !errors.Is(err, ErrNoSpace) {
			// Others filled the disk between the space check and the copy.
			err = fmt.Errorf("%w: %w", ErrNoSpace, err)
		}
	}()
	if err = fill(tmp); err != nil {
		return err
	}
	if err = tmp.Chmod(0o600); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	// Link, not rename: link fails if final appeared meanwhile, so a racing
	// writer of the same ID can never be silently replaced.
	if err = os.Link(tmp.Name(), final); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("%s appeared concurrently: %w", final, ErrExists)
		}
		return fmt.Errorf("publish %s: %w", final, err)
	}
	_ = os.Remove(tmp.Name())
	return atomicfile.SyncDir(dir)
}

// growFile sets a file's size (reserving it all with reserveAll) and
// fsyncs it: the caller grows the loop device and filesystem next, and a
// crash must not leave a filesystem larger than its image. The space is
// reserved before the size is set: a failed reservation leaves the size
// as it was, so that a retry grows (and reserves) again.
func growFile(path string, size int64, reserveAll bool) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	if reserveAll {
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		// fallocate extends the file as it allocates; on failure the old
		// size comes back.
		if err := reserve(f, size); err != nil {
			return errors.Join(err, f.Truncate(fi.Size()))
		}
	}
	if err := f.Truncate(size); err != nil {
		return err
	}
	return f.Sync()
}

// Get returns a volume's image.
func (l *Local) Get(_ context.Context, id string) (Image, error) {
	p, fi, err := statImage("volume", id, l.volumePath)
	if err != nil {
		return Image{}, err
	}
	return Image{ID: id, Path: p, Size: fi.Size()}, nil
}

// statImage checks id and stats its image file at path(id): ErrNotFound when
// there is none. kind ("volume", "snapshot") names it in errors.
func statImage(kind, id string, path func(id string) string) (string, os.FileInfo, error) {
	if err := ValidateID(id); err != nil {
		return "", nil, err
	}
	p := path(id)
	fi, err := os.Stat(p)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil, fmt.Errorf("%s %s: %w", kind, id, ErrNotFound)
	}
	if err != nil {
		return "", nil, fmt.Errorf("stat %s %s: %w", kind, id, err)
	}
	return p, fi, nil
}

// List returns all volumes, in name order.
func (l *Local) List(ctx context.Context) ([]Image, error) {
	return listAll(l.volumes, func(id string) (Image, error) { return l.Get(ctx, id) })
}

// listAll gets every image in dir, skipping ones deleted meanwhile.
func listAll[T any](dir string, get func(id string) (T, error)) ([]T, error) {
	ids, err := listIDs(dir)
	if err != nil {
		return nil, err
	}
	out := make([]T, 0, len(ids))
	for _, id := range ids {
		v, err := get(id)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func listIDs(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	var ids []string
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !strings.HasSuffix(name, imageExt) {
			continue
		}
		ids = append(ids, strings.TrimSuffix(name, imageExt))
	}
	return ids, nil
}

// Delete removes a volume; a missing one is not an error.
func (l *Local) Delete(_ context.Context, id string) error {
	return l.removeImage("volume", id, l.volumePath)
}

// removeImage checks id and removes its image file at path(id); a missing
// one is not an error. kind ("volume", "snapshot") names it in errors.
func (l *Local) removeImage(kind, id string, path func(id string) string) error {
	if err := ValidateID(id); err != nil {
		return err
	}
	if err := os.Remove(path(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete %s %s: %w", kind, id, err)
	}
	l.log.Info("deleted "+kind, "id", id)
	return nil
}

// Expand grows a volume to at least size. Asking the current size again is a
// no-op; asking less is volerr.ErrInvalid. The caller refreshes any loop device.
func (l *Local) Expand(ctx context.Context, id string, size int64) (Image, error) {
	img, err := l.Get(ctx, id)
	if err != nil {
		return Image{}, err
	}
	size, err = alignSize(size)
	if err != nil {
		return Image{}, err
	}
	switch {
	case size == img.Size:
		return img, nil
	case size < img.Size:
		return Image{}, fmt.Errorf("shrink %s from %d to %d: %w", id, img.Size, size, volerr.ErrInvalid)
	}
	release, err := l.book.take(id, size-img.Size, l.Capacity)
	if err != nil {
		return Image{}, err
	}
	defer release()
	if err := growFile(img.Path, size, l.prov.Reserve()); err != nil {
		return Image{}, fmt.Errorf("grow %s: %w", id, err)
	}
	l.log.Info("expanded volume", "id", id, "from", img.Size, "to", size)
	img.Size = size
	return img, nil
}

// Usage is what a data dir's filesystem holds and has left, and what its
// volume images promise and take.
type Usage struct {
	Size, Free          int64
	Promised, Allocated int64
}

// Usage reads the data dir's filesystem and sums its volume images.
func (l *Local) Usage(_ context.Context) (Usage, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(l.dir, &st); err != nil {
		return Usage{}, fmt.Errorf("statfs %s: %w", l.dir, err)
	}
	promised, allocated, err := l.usage()
	if err != nil {
		return Usage{}, err
	}
	return Usage{Size: int64(st.Blocks) * st.Bsize, Free: int64(st.Bavail) * st.Bsize, Promised: promised, Allocated: allocated}, nil
}

// Capacity returns the bytes new images may still promise: the free space
// of the data dir's filesystem, less what its images may still take beyond
// what they hold (all of it when images are reserved), or, with
// overcommit, that percent of the space the images are given less what
// they promise.
func (l *Local) Capacity(ctx context.Context) (int64, error) {
	u, err := l.Usage(ctx)
	if err != nil {
		return 0, err
	}
	return l.prov.promisable(u.Free, u.Promised, u.Allocated), nil
}

// usage sums the volume images' apparent (promised) and allocated bytes.
func (l *Local) usage() (promised, allocated int64, err error) {
	ids, err := listIDs(l.volumes)
	if err != nil {
		return 0, 0, err
	}
	for _, id := range ids {
		var st unix.Stat_t
		err := unix.Stat(l.volumePath(id), &st)
		if errors.Is(err, unix.ENOENT) {
			continue // deleted meanwhile
		}
		if err != nil {
			return 0, 0, fmt.Errorf("stat volume %s: %w", id, err)
		}
		promised += st.Size
		// Blocks past the size (the filesystem's own) are not the image's.
		allocated += min(st.Blocks*512, st.Size)
	}
	return promised, allocated, nil
}

// Provisioned returns this backend with images provisioned by p; the copy
// shares the data dir and its book of promises under way.
func (l *Local) Provisioned(p Provisioning) *Local {
	c := *l
	c.prov = p
	return &c
}
