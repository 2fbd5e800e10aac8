package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/mount"
)

// loopDevice is a kernel loop device on the volume's image file: no
// server, nothing to heal.
type loopDevice struct {
	loop  mount.Loop
	image func(ctx context.Context, volume string) (string, error)
}

func (loopDevice) Check(string) error { return nil }

func (l loopDevice) Attach(ctx context.Context, r attachRequest) (attachment, error) {
	return attachLoop(ctx, l.loop, r.Image, r.ReadOnly)
}

func (l loopDevice) Find(ctx context.Context, volume string) (string, error) {
	image, err := l.image(ctx, volume)
	if errors.Is(err, ErrVolumeNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return findLoop(ctx, l.loop, image)
}

// Holds tells whether sysfs names the volume's image file for dev: its
// full path, or its tail below the data dir when that dir is out of this
// agent's reach (a deleted StorageCluster's), when Find by path cannot
// work. The caller found dev mounted at the volume's staging path, so the
// tail is a check on the mount, not the identity itself.
func (l loopDevice) Holds(volume, dev string) (bool, error) {
	name, found, err := l.loop.BackingName(dev)
	if err != nil || !found {
		return false, err
	}
	return strings.HasSuffix(name, "/"+backend.VolumeFile(volume)), nil
}

func (l loopDevice) Detach(ctx context.Context, _, dev string) error {
	return detachLoop(ctx, l.loop, dev)
}

func (loopDevice) Stop(context.Context, string) error { return nil }

func (loopDevice) Serving(context.Context, string) (HealResult, bool) { return HealSkipped, true }

func (loopDevice) Heal(context.Context, string, func(context.Context) (string, error)) (HealResult, error) {
	return HealSkipped, nil
}

func (l loopDevice) Expand(ctx context.Context, volume string) (string, error) {
	image, err := l.image(ctx, volume)
	if err != nil {
		return "", err
	}
	return refreshLoop(ctx, l.loop, volume, image)
}

func (loopDevice) Condition(context.Context, string) (bool, string) { return false, "" }

// attachLoop attaches a loop device to backing, or returns the one there.
func attachLoop(ctx context.Context, loop mount.Loop, backing string, readOnly bool) (attachment, error) {
	_, found, err := loop.Find(ctx, backing)
	if err != nil {
		return attachment{}, fmt.Errorf("find loop device of %s: %w", backing, err)
	}
	att := attachment{NewDevice: !found}
	if att.Device, err = loop.Attach(ctx, backing, readOnly); err != nil {
		return att, fmt.Errorf("attach %s: %w", backing, err)
	}
	return att, nil
}

// findLoop returns the loop device on backing; "" when none is.
func findLoop(ctx context.Context, loop mount.Loop, backing string) (string, error) {
	dev, found, err := loop.Find(ctx, backing)
	if err != nil {
		return "", fmt.Errorf("find loop device of %s: %w", backing, err)
	}
	if !found {
		return "", nil
	}
	return dev, nil
}

func detachLoop(ctx context.Context, loop mount.Loop, dev string) error {
	if err := loop.Detach(ctx, dev); err != nil {
		return fmt.Errorf("detach %s: %w", dev, err)
	}
	return nil
}

// refreshLoop makes the loop device on backing take the file's new size.
func refreshLoop(ctx context.Context, loop mount.Loop, volume, backing string) (string, error) {
	dev, found, err := loop.Find(ctx, backing)
	if err != nil {
		return "", fmt.Errorf("find loop device of %s: %w", backing, err)
	}
	if !found {
		return "", fmt.Errorf("volume %s: %w", volume, ErrNotStaged)
	}
	if err := loop.Refresh(ctx, dev); err != nil {
		return "", fmt.Errorf("refresh %s: %w", dev, err)
	}
	return dev, nil
}
