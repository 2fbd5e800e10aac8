package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/mount"
)

// freezeLimit bounds how long a volume's filesystem stays frozen for a copy:
// its writers wait meanwhile. A copy that takes longer fails (and is
// retried); a reflink copy takes milliseconds.
const freezeLimit = 2 * time.Minute

// Quiesce holds a volume still while the backend copies its image into a
// snapshot or clone (backend.Quiescer). It takes the volume's lock, so
// nothing stages, unstages or heals it meanwhile; if the volume is staged
// here with a filesystem, it freezes that filesystem. A volume staged as a
// raw block device cannot be frozen: the hold then says it is not stable,
// and the backend copies it only by reflink.
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
	thaw, err := a.mounts.Freeze(ctx, dev)
	if errors.Is(err, mount.ErrNotFound) {
		thaw, err = a.freezeShared(ctx, volumeID, dev)
	}
	if errors.Is(err, mount.ErrNotFound) {
		return backend.Hold{Stable: false, Ctx: ctx, Release: unlock}, nil
	}
	if err != nil {
		unlock()
		return backend.Hold{}, fmt.Errorf("freeze volume %s: %w", volumeID, err)
	}
	hctx, cancel := context.WithTimeout(ctx, freezeLimit)
	return backend.Hold{Stable: true, Ctx: hctx, Release: func() {
		cancel()
		if err := thaw(); err != nil {
			a.log.Error(err, "thaw after copy", "volume", volumeID)
		}
		unlock()
	}}, nil
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
	dir := a.freezeDir
	if dir == "" {
		dir = os.TempDir()
	}
	return a.mounts.FreezeElsewhere(ctx, dev, vol.Spec.FSType, filepath.Join(dir, "berth-freeze-"+volumeID))
}
