package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/mount"
)

// DefaultFreezeLimit bounds how long a volume's filesystem stays frozen
// for a copy: its writers wait meanwhile. A copy that takes longer fails
// (and is retried); a reflink copy takes milliseconds.
const DefaultFreezeLimit = 2 * time.Minute

// Quiesce holds a volume still while the backend copies its image into a
// snapshot or clone (backend.Quiescer). It takes the volume's lock, so
// nothing stages, unstages or heals it meanwhile; if the volume is staged
// here with a filesystem, it freezes that filesystem. A volume staged as a
// raw block device cannot be frozen: the hold then says it is not stable,
// and the backend copies it only by reflink. A freeze ends by the freeze
// limit even when the copy hangs, and a freeze record lets the next agent
// thaw it when this one dies first (ThawLeftovers).
func (a *Agent) Quiesce(ctx context.Context, volumeID string) (backend.Hold, error) {
	unlock, err := a.lock(volumeID)
	if err != nil {
		return backend.Hold{}, err
	}
	dev, err := a.attachedDevice(ctx, volumeID)
	if err != nil {
		unlock()
		return backend.Hold{}, fmt.Errorf("find device of volume %s: %w", volumeID, err)
	}
	if dev == "" {
		// Not staged on this node, the only one that holds a local image.
		return backend.Hold{Stable: true, Ctx: ctx, Release: unlock}, nil
	}
	thaw, err := a.freeze(ctx, volumeID, dev)
	if errors.Is(err, mount.ErrNotFound) {
		return backend.Hold{Stable: false, Ctx: ctx, Release: unlock}, nil
	}
	if err != nil {
		unlock()
		return backend.Hold{}, fmt.Errorf("freeze volume %s: %w", volumeID, err)
	}
	var once sync.Once
	thawOnce := func() {
		once.Do(func() {
			if err := thaw(); err != nil {
				a.log.Error(err, "thaw after copy", "volume", volumeID)
				return // the record stays: the next start tries again
			}
			a.removeFreezeRecord(volumeID)
		})
	}
	limit := a.freezeLimit
	hctx, cancel := context.WithTimeout(ctx, limit)
	// A copy that ignores its context (blocked in I/O) must not keep the
	// writers waiting: the thaw comes at the limit whatever the copy does.
	// The context ends first, so the copy cannot succeed past the thaw.
	timer := time.AfterFunc(limit, func() {
		cancel()
		a.log.Info("freeze limit passed during a copy: thawing", "volume", volumeID, "limit", limit)
		thawOnce()
	})
	return backend.Hold{Stable: true, Ctx: hctx, Release: func() {
		timer.Stop()
		cancel()
		thawOnce()
		unlock()
	}}, nil
}

// freeze freezes the filesystem on dev, the device of volumeID, behind a
// freeze record. mount.ErrNotFound: no filesystem of dev is mounted.
func (a *Agent) freeze(ctx context.Context, volumeID, dev string) (func() error, error) {
	if err := a.writeFreezeRecord(volumeID, freezeRecord{Device: dev}); err != nil {
		return nil, err
	}
	thaw, err := a.mounts.Freeze(ctx, dev)
	if errors.Is(err, mount.ErrNotFound) {
		thaw, err = a.freezeShared(ctx, volumeID, dev)
	}
	// A freeze that timed out may still complete: mount.Manager thaws it
	// then, and the record stays in case this agent dies first.
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		a.removeFreezeRecord(volumeID)
	}
	return thaw, err
}

// freezeShared freezes the filesystem of an RWX volume's device, which its
// share manager mounts in its own pod, out of this agent's sight (dev is
// staged here as the share manager's block device). mount.ErrNotFound: the
// volume is no shared filesystem, or nothing mounts it.
func (a *Agent) freezeShared(ctx context.Context, volumeID, dev string) (func() error, error) {
	vol, err := a.readVolume(ctx, volumeID)
	if errors.Is(err, ErrVolumeNotFound) {
		return nil, mount.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	if !sharedFS(vol, false) || vol.Spec.FSType == "" {
		return nil, mount.ErrNotFound
	}
	scratch := a.freezeScratch(volumeID)
	if err := a.writeFreezeRecord(volumeID, freezeRecord{Device: dev, FSType: vol.Spec.FSType, Scratch: scratch}); err != nil {
		return nil, err
	}
	return a.mounts.FreezeElsewhere(ctx, dev, vol.Spec.FSType, scratch)
}
