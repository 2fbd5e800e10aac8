package backend

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-io/berth/internal/volerr"
)

// ErrNoDataDir: the volume's StorageCluster keeps its images in a data dir
// this agent does not serve (not mounted in its pod, or the cluster is gone).
var ErrNoDataDir = errors.New("data dir not served by this agent")

// Set is the node agent's local backends, one per data dir it serves: the
// agent serves every StorageCluster of the Kubernetes cluster, and each
// keeps its images in its own data dir. A new image goes to its cluster's
// data dir; an existing image is found where it is (volume and snapshot IDs
// are unique across clusters: they name cluster-scoped objects).
type Set struct {
	dirs   []string // sorted
	locals map[string]*Local
	// place returns where a volume's StorageCluster keeps its images.
	place func(ctx context.Context, volumeID string) (Place, error)
}

// Place is where a StorageCluster keeps its local images, and how they are
// provisioned.
type Place struct {
	Dir          string
	Provisioning Provisioning
}

// NewSet opens every data dir. place tells, for a volume, where its
// StorageCluster keeps images; it may return ErrNotFound when the cluster
// has no object (tests that run an agent alone), which is only accepted
// when the agent serves a single data dir (its images are then reserved).
func NewSet(dirs []string, place func(ctx context.Context, volumeID string) (Place, error), log logr.Logger) (*Set, error) {
	s := &Set{locals: map[string]*Local{}, place: place}
	for _, d := range dirs {
		if _, dup := s.locals[d]; dup {
			continue
		}
		l, err := NewLocal(d, log.WithValues("dataDir", d))
		if err != nil {
			return nil, err
		}
		s.locals[d] = l
		s.dirs = append(s.dirs, d)
	}
	slices.Sort(s.dirs)
	return s, nil
}

// Dirs returns the data dirs served, sorted.
func (s *Set) Dirs() []string { return slices.Clone(s.dirs) }

// Usage returns each data dir's Usage, by dir; a dir that cannot be read
// is left out and its error returned with the others'.
func (s *Set) Usage(ctx context.Context) (map[string]Usage, error) {
	out := make(map[string]Usage, len(s.dirs))
	var errs []error
	for _, d := range s.dirs {
		u, err := s.locals[d].Usage(ctx)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out[d] = u
	}
	return out, errors.Join(errs...)
}

// WithQuiescer sets the quiescer of every backend.
func (s *Set) WithQuiescer(q Quiescer) *Set {
	for _, l := range s.locals {
		l.WithQuiescer(q)
	}
	return s
}

// Local returns the backend of a data dir.
func (s *Set) Local(dir string) (*Local, error) {
	if l, ok := s.locals[dir]; ok {
		return l, nil
	}
	return nil, fmt.Errorf("%w: %s (served: %v); the operator adds it to the agent DaemonSet, whose pods then restart", ErrNoDataDir, dir, s.dirs)
}

// forNew returns the backend a new image of volume id goes to, with its
// cluster's provisioning.
func (s *Set) forNew(ctx context.Context, id string) (*Local, error) {
	p, err := s.place(ctx, id)
	if errors.Is(err, ErrNotFound) && len(s.dirs) == 1 {
		return s.locals[s.dirs[0]], nil
	}
	if err != nil {
		return nil, fmt.Errorf("data dir of volume %s: %w", id, err)
	}
	l, err := s.Local(p.Dir)
	if err != nil {
		return nil, err
	}
	return l.Provisioned(p.Provisioning), nil
}

// provisioned returns l, which holds volume id's image, with the
// provisioning of the volume's cluster.
func (s *Set) provisioned(ctx context.Context, id string, l *Local) (*Local, error) {
	p, err := s.place(ctx, id)
	if errors.Is(err, ErrNotFound) && len(s.dirs) == 1 {
		return l, nil
	}
	if err != nil {
		return nil, fmt.Errorf("provisioning of volume %s: %w", id, err)
	}
	return l.Provisioned(p.Provisioning), nil
}

// find returns the backend holding volume id's image (found by get); with
// none, the error says the image is not found.
func (s *Set) find(ctx context.Context, id string, get func(*Local) error) (*Local, error) {
	for _, d := range s.dirs {
		err := get(s.locals[d])
		if err == nil {
			return s.locals[d], nil
		}
		if !errors.Is(err, ErrNotFound) {
			return nil, err
		}
	}
	if len(s.dirs) == 0 {
		return nil, fmt.Errorf("%s: %w (this agent serves no data dir)", id, ErrNotFound)
	}
	return nil, fmt.Errorf("%s in data dirs %v: %w", id, s.dirs, ErrNotFound)
}

func (s *Set) findVolume(ctx context.Context, id string) (*Local, error) {
	return s.find(ctx, id, hasVolume(ctx, id))
}

func (s *Set) findSnapshot(ctx context.Context, id string) (*Local, error) {
	return s.find(ctx, id, hasSnapshot(ctx, id))
}

func hasVolume(ctx context.Context, id string) func(*Local) error {
	return func(l *Local) error { _, err := l.Get(ctx, id); return err }
}

func hasSnapshot(ctx context.Context, id string) func(*Local) error {
	return func(l *Local) error { _, err := l.GetSnapshot(ctx, id); return err }
}

// forCopy returns the backend a new volume id copied from source goes to.
// A copy never crosses data dirs (they may be on different filesystems):
// a source (what: volume or snapshot, found by has) that is only in
// another data dir is refused.
func (s *Set) forCopy(ctx context.Context, id, what, source string, has func(*Local) error) (*Local, error) {
	l, err := s.forNew(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := has(l); errors.Is(err, ErrNotFound) {
		if _, ferr := s.find(ctx, source, has); ferr == nil {
			return nil, fmt.Errorf("%w: %s %s belongs to another StorageCluster's data dir than volume %s", volerr.ErrInvalid, what, source, id)
		}
	}
	return l, nil
}

// Create makes volume id's image in its cluster's data dir.
func (s *Set) Create(ctx context.Context, id string, size int64) (Image, error) {
	l, err := s.forNew(ctx, id)
	if err != nil {
		return Image{}, err
	}
	return l.Create(ctx, id, size)
}

// CreateFromSnapshot restores a snapshot of the same data dir.
func (s *Set) CreateFromSnapshot(ctx context.Context, id, snapshotID string, size int64) (Image, error) {
	l, err := s.forCopy(ctx, id, "snapshot", snapshotID, hasSnapshot(ctx, snapshotID))
	if err != nil {
		return Image{}, err
	}
	return l.CreateFromSnapshot(ctx, id, snapshotID, size)
}

// CreateFromVolume clones a volume of the same data dir.
func (s *Set) CreateFromVolume(ctx context.Context, id, sourceID string, size int64) (Image, error) {
	l, err := s.forCopy(ctx, id, "volume", sourceID, hasVolume(ctx, sourceID))
	if err != nil {
		return Image{}, err
	}
	return l.CreateFromVolume(ctx, id, sourceID, size)
}

// Get returns a volume's image, wherever it is.
func (s *Set) Get(ctx context.Context, id string) (Image, error) {
	l, err := s.findVolume(ctx, id)
	if err != nil {
		return Image{}, err
	}
	return l.Get(ctx, id)
}

// Delete removes a volume's image; a missing one is not an error.
func (s *Set) Delete(ctx context.Context, id string) error {
	l, err := s.findVolume(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return l.Delete(ctx, id)
}

// Expand grows a volume's image.
func (s *Set) Expand(ctx context.Context, id string, size int64) (Image, error) {
	l, err := s.findVolume(ctx, id)
	if err != nil {
		return Image{}, err
	}
	if l, err = s.provisioned(ctx, id, l); err != nil {
		return Image{}, err
	}
	return l.Expand(ctx, id, size)
}

// CreateSnapshot copies a volume into a snapshot beside it.
func (s *Set) CreateSnapshot(ctx context.Context, snapID, sourceID string) (Snapshot, error) {
	if l, err := s.findSnapshot(ctx, snapID); err == nil {
		return l.CreateSnapshot(ctx, snapID, sourceID) // a retry: the Local checks the source
	}
	l, err := s.findVolume(ctx, sourceID)
	if err != nil {
		return Snapshot{}, err
	}
	if l, err = s.provisioned(ctx, sourceID, l); err != nil {
		return Snapshot{}, err
	}
	return l.CreateSnapshot(ctx, snapID, sourceID)
}

// DeleteSnapshot removes a snapshot; a missing one is not an error.
func (s *Set) DeleteSnapshot(ctx context.Context, id string) error {
	l, err := s.findSnapshot(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return l.DeleteSnapshot(ctx, id)
}

// Format reads the format record of a volume's image.
func (s *Set) Format(ctx context.Context, id string) (FormatRecord, bool, error) {
	l, err := s.findVolume(ctx, id)
	if err != nil {
		return FormatRecord{}, false, err
	}
	return l.Format(ctx, id)
}

// RecordFormat writes the format record of a volume's image.
func (s *Set) RecordFormat(ctx context.Context, id, fsType string, at time.Time) error {
	l, err := s.findVolume(ctx, id)
	if err != nil {
		return err
	}
	return l.RecordFormat(ctx, id, fsType, at)
}

// Capacity returns what new images of a data dir, provisioned by p, may
// still promise.
func (s *Set) Capacity(ctx context.Context, dir string, p Provisioning) (int64, error) {
	l, err := s.Local(dir)
	if err != nil {
		return 0, err
	}
	return l.Provisioned(p).Capacity(ctx)
}
