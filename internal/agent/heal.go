package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/blockdev/launch"
)

// HealResult says what Heal found or did.
type HealResult string

const (
	// HealSkipped means not a userspace volume staged here, or its objects are gone.
	HealSkipped HealResult = "skipped"
	// HealServing means that a server was already running.
	HealServing HealResult = "serving"
	// HealRestarted means that a new server took the connection over from the keeper.
	HealRestarted HealResult = "restarted"
	// HealBusy means that another operation held the volume: try again later.
	HealBusy HealResult = "busy"
)

// Heal restarts the blockdev server of a staged userspace volume whose
// server is gone (after an agent restart or a server crash): the new server
// takes the kernel connection over, and I/O that waited goes on. It does
// not wait for the volume lock, shared with the CSI calls: a call holding
// it is the one at work on the volume (a stage starts its own server), and
// a healer that waited would take the lock the moment that call let go of
// it, so kubelet's next call (publish right after stage) would fail as
// busy. ErrBusy (HealBusy) makes the healer try again after its busy retry.
// It returns the Volume (nil when gone), ErrKeeperDown or ErrConnectionLost
// when the volume cannot be healed, ErrVolumeNotFound (with HealSkipped)
// when a staged userspace volume's image is gone, or, for an image that is
// not a file of this node (RBD), its Volume object. An image file still
// here is served even when its Volume object was deleted by hand: the
// volume is staged and its pods' I/O waits on it.
func (a *Agent) Heal(ctx context.Context, volumeID string) (*v1.Volume, HealResult, error) {
	// The heal pass's hold group learns that this volume's server is
	// started (or needs none) as soon as it is, not when the Event below
	// has waited for the cache.
	started := sync.OnceFunc(launch.HoldFrom(ctx).Done)
	defer started()
	d, err := a.device(volumeID)
	if err != nil {
		return nil, HealSkipped, err
	}
	// The common case, a live server, needs no lock: periodic passes then
	// never make a CSI call on the volume wait or fail as busy.
	if res, ok := d.Serving(ctx, volumeID); ok {
		a.checkReport(ctx, volumeID)
		return nil, res, nil
	}
	unlock, err := a.lock(volumeID)
	if err != nil {
		return nil, HealBusy, err
	}
	release := sync.OnceFunc(unlock)
	defer release()
	// Read again under the lock: an unstage may have ended meanwhile.
	if d, err = a.device(volumeID); err != nil {
		return nil, HealSkipped, err
	}
	// An image file in this node's data dirs is found with a stat: its
	// server starts before any read of the API server or its cache, which
	// after an agent restart are still filling while every volume of the
	// node waits. The Volume is read afterwards, for the Event only.
	if img, ierr := a.images.Get(ctx, volumeID); ierr == nil {
		res, err := d.Heal(ctx, volumeID, func(context.Context) (string, error) { return img.Path, nil })
		started()
		if err == nil && res == HealRestarted {
			a.reportAfterHeal(ctx, volumeID, d)
		}
		// Not under the lock: a cache still filling must not hold up
		// kubelet's calls on a volume that is served again.
		release()
		vol, _ := a.cachedVolume(ctx, volumeID)
		return vol, res, err
	}
	// From the cache when it has the Volume: an agent restart heals every
	// volume at once, and the API server is busy enough then.
	vol, err := a.cachedVolume(ctx, volumeID)
	if err != nil && !errors.Is(err, ErrVolumeNotFound) {
		return nil, HealSkipped, err
	}
	image := func(ctx context.Context) (string, error) {
		if vol == nil {
			return "", fmt.Errorf("volume %s is staged in userspace on this node, but its Volume object is gone, "+
				"so no blockdev server can be started for it: its I/O waits until it is unstaged: %w", volumeID, err)
		}
		image, err := a.imagePath(ctx, volumeID)
		if errors.Is(err, ErrVolumeNotFound) {
			return "", fmt.Errorf("volume %s is staged in userspace on this node, but its image is gone, "+
				"so no blockdev server can be started for it: its I/O waits until it is unstaged: %w", volumeID, err)
		}
		return image, err
	}
	res, err := d.Heal(ctx, volumeID, image)
	started()
	if err == nil && res == HealRestarted {
		a.reportAfterHeal(ctx, volumeID, d)
	}
	return vol, res, err
}

// StagedHere lists the volumes staged over a userspace transport on this
// node, by the agent's own records, whose images are files in this node's
// data dirs: the healer heals those without the API server. An RBD image
// is not among them: another node may hold it once this one was fenced,
// which only its Attachment tells.
func (a *Agent) StagedHere() ([]string, error) {
	staged, err := a.records().list()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, v := range staged {
		if _, err := a.images.Get(context.Background(), v); err == nil {
			out = append(out, v)
		}
	}
	return out, nil
}

// prepareUnstage readies a volume for unmount and detach: a server must
// run, or flushing the file system would wait for one. With the keeper
// down or the connection gone, I/O fails fast: there is nothing to wait
// for, so that is no reason to stop.
func (a *Agent) prepareUnstage(ctx context.Context, volume string, d device) error {
	_, err := d.Heal(ctx, volume, func(ctx context.Context) (string, error) { return a.imagePath(ctx, volume) })
	if errors.Is(err, ErrKeeperDown) || errors.Is(err, ErrConnectionLost) {
		return nil
	}
	return err
}
