package backend

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/volerr"
)

// Provisioning is how much space a data dir's images may promise: a
// StorageCluster's spec.overcommit.
type Provisioning struct {
	// OvercommitPercent is 0 to reserve each image's full size (fallocate)
	// when it is made or grown; 100 or more makes sparse images that may
	// promise, in all, that percent of the space they are given (what is
	// free plus what the images take).
	OvercommitPercent int32
}

// Reserve says whether images are fully allocated when made or grown.
func (p Provisioning) Reserve() bool { return p.OvercommitPercent == 0 }

func (p Provisioning) String() string {
	if p.Reserve() {
		return "reserved"
	}
	return fmt.Sprintf("overcommit %d%%", p.OvercommitPercent)
}

// promisable returns what new images may still promise, given the data
// dir's free bytes and its images' promised (apparent) and allocated
// bytes. Reserved images are allocated, so for them this is the free
// space; images made sparse (by overcommit, or before reservation) count
// for what they may still take.
func (p Provisioning) promisable(free, promised, allocated int64) int64 {
	pool := free + allocated
	percent := int64(p.OvercommitPercent)
	if percent < 100 {
		percent = 100
	}
	if pool/100 > math.MaxInt64/percent-1 {
		return math.MaxInt64 // beyond any size asked
	}
	left := pool/100*percent + pool%100*percent/100 - promised
	return max(left, 0)
}

// reserve allocates [0, size) of an image so that writes to it never find
// the filesystem full. A filesystem without fallocate is refused, saying
// how to go on without reservation.
func reserve(f *os.File, size int64) error {
	err := unix.Fallocate(int(f.Fd()), 0, 0, size)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.ENOSPC):
		return fmt.Errorf("reserve %d bytes: %w", size, ErrNoSpace)
	case errors.Is(err, syscall.EOPNOTSUPP):
		return fmt.Errorf("reserve %d bytes: the data dir's filesystem cannot preallocate (fallocate: %v); set the StorageCluster's spec.overcommit for sparse images: %w", size, err, volerr.ErrInvalid)
	default:
		return fmt.Errorf("reserve %d bytes: %w", size, err)
	}
}

// spaceBook holds the space promised by creates and expands under way.
type spaceBook struct {
	mu      sync.Mutex
	pending map[string]int64
}

// take promises size bytes to volume id if capacity (which does not yet
// count them) has room beside the other promises under way; release
// gives them back once the image holds them.
func (b *spaceBook) take(id string, size int64, capacity func(context.Context) (int64, error)) (release func(), err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	free, err := capacity(context.Background())
	if err != nil {
		return nil, err
	}
	for _, n := range b.pending {
		free -= n
	}
	if size > free {
		return nil, fmt.Errorf("%d bytes asked, %d left to promise: %w", size, max(free, 0), ErrNoSpace)
	}
	b.pending[id] += size
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.pending[id] -= size; b.pending[id] <= 0 {
			delete(b.pending, id)
		}
	}, nil
}
