package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/mount"
	"github.com/berth-io/berth/internal/volerr"
)

// Undo undoes one stale attachment entry on this node (fence.Undoer): a
// pod's mount is unmounted; a stage record's device is unmounted wherever it
// is and detached. The fence's cleaner holds the volume lock meanwhile.
// Undoing what is already gone succeeds.
func (a *Agent) Undo(ctx context.Context, s v1.StaleAttachment) error {
	// The entry is an API object's: anyone who may write NodeCleanups
	// must not reach umount and rm outside the node's volume folders.
	if err := checkVolumeName(s.Volume); err != nil {
		return fmt.Errorf("stale entry: %w: %w", err, fence.ErrRefused)
	}
	paths := []string{s.MountDir}
	if s.StagingPath != "" {
		paths = append(paths, s.StagingPath)
	}
	if err := a.checkRecordedPaths(paths...); err != nil {
		return fmt.Errorf("stale entry of %s: %w: %w", s.Volume, err, fence.ErrRefused)
	}
	// The fence cleaner checks, before it asks, that this node holds no
	// longer what s.UndoPath names.
	if !s.IsStage() {
		if err := a.mounts.RevokePublish(ctx, s.UndoPath()); err != nil {
			return fmt.Errorf("unmount stale %s: %w", s.MountDir, err)
		}
		return nil
	}
	if err := a.forceUnstage(ctx, s.Volume, s.UndoPath(), lockBroken(s.Reason)); errors.Is(err, errForeignDevice) {
		return fmt.Errorf("%w: %w", err, fence.ErrRefused) // another device there: never ours to undo
	} else if err != nil {
		return err
	}
	return nil
}

// errForeignDevice: a staging path holds another device than the volume's.
// Its own sentinel, so that an invalid argument from deeper down (the keeper,
// mount) never makes the cleaner drop an entry undone.
var errForeignDevice = volerr.New(volerr.ErrInvalid, "not the volume's device")

// forceUnstage removes every mount of the volume's device and detaches it,
// even while pods use it. The caller holds the volume lock. Only the
// volume's own device is unmounted: a staging path where another device is
// mounted (another driver's, or another volume's) is refused, or every
// mount of that device would go.
// broken says that another node took the volume's lock over.
func (a *Agent) forceUnstage(ctx context.Context, volume, staging string, broken bool) error {
	staged, _, err := a.mounts.StagedDevice(ctx, staging)
	if err != nil {
		return fmt.Errorf("staged device at %s: %w", staging, err)
	}
	d, err := a.device(volume)
	if err != nil {
		return err
	}
	// Cutting a broken lock's connection (prepareForceUnstage) takes the
	// backing file, and Find with it, away: name the staged device first.
	held := a.heldDevice(volume, d, staged)
	if err := a.prepareForceUnstage(ctx, volume, d, broken); err != nil {
		return err
	}
	dev, err := d.Find(ctx, volume)
	if err != nil {
		return err
	}
	if dev == "" {
		dev = held
	}
	if staged != "" && staged != dev {
		if dev != "" {
			return fmt.Errorf("%s holds %s, which is not volume %s's device (%s): %w", staging, staged, volume, dev, errForeignDevice)
		}
		// The volume's device is unknown (its image is gone): take off only
		// what is mounted at the staging path, never every mount of a
		// device that may not be the volume's.
		for _, p := range []string{filepath.Join(staging, mount.BlockStageFile), staging} {
			if err := a.mounts.ForceUnpublish(ctx, p); err != nil {
				return fmt.Errorf("unmount stale staging %s: %w", p, err)
			}
		}
		a.log.Info("force unmounted a staging path whose volume has no device here", "volume", volume, "stagingPath", staging, "device", staged)
		return nil
	}
	if dev != "" {
		if _, err := a.mounts.ForceUnmountDevice(ctx, dev); err != nil {
			return err
		}
	}
	if _, err := a.mounts.Unstage(ctx, staging); err != nil {
		return fmt.Errorf("remove staging %s: %w", staging, err)
	}
	if dev != "" {
		if err := d.Detach(ctx, volume, dev); err != nil {
			return err
		}
	}
	if err := a.stopDevice(ctx, volume, d); err != nil {
		return err
	}
	a.log.Info("force unstaged", "volume", volume, "stagingPath", staging, "device", dev)
	return nil
}

// DetachCluster forcibly removes from this node every volume of the storage
// cluster: pods' mounts, staging, loop devices, and this node's entries in
// the volumes' Attachments. It returns the volumes it detached.
func (a *Agent) DetachCluster(ctx context.Context, cluster string) ([]string, error) {
	holds, err := a.Holds(ctx)
	if err != nil {
		return nil, err
	}
	byVolume := map[string][]v1.AttachmentEntry{}
	var order []string
	for _, h := range holds {
		if _, seen := byVolume[h.Volume]; !seen {
			order = append(order, h.Volume)
		}
		byVolume[h.Volume] = append(byVolume[h.Volume], h.Entry)
	}
	var detached []string
	var errs []error
	for _, volume := range order {
		// Read the Volume wherever its image lives: the entry is this node's.
		vol := &v1.Volume{}
		if err := a.api.Get(ctx, client.ObjectKey{Name: volume}, vol); err != nil {
			if apierrors.IsNotFound(err) {
				// Nobody can tell which cluster it was of: leave it to the
				// stale-attachment GC rather than force it off the node.
				a.log.Info("held volume has no Volume object; not detaching it", "volume", volume)
				continue
			}
			errs = append(errs, fmt.Errorf("read Volume %s: %w", volume, err))
			continue
		}
		if vol.Spec.StorageCluster != cluster {
			continue
		}
		if err := a.detachVolume(ctx, volume, byVolume[volume]); err != nil {
			errs = append(errs, err)
			continue
		}
		detached = append(detached, volume)
	}
	return detached, errors.Join(errs...)
}

// detachVolume force-unmounts a volume's pod mounts and staging on this
// node and drops the node's entries, pods first, under the volume lock.
func (a *Agent) detachVolume(ctx context.Context, volume string, entries []v1.AttachmentEntry) error {
	if err := checkVolumeName(volume); err != nil {
		return err
	}
	for _, e := range entries {
		if err := a.checkRecordedPaths(e.MountDir); err != nil {
			return fmt.Errorf("detach %s: %w", volume, err)
		}
	}
	unlock, err := a.lockBackground(ctx, volume)
	if err != nil {
		return err // the cleanup reconciler retries
	}
	defer unlock()
	for _, stage := range []bool{false, true} {
		for _, e := range entries {
			if e.IsStage() != stage {
				continue
			}
			var err error
			if stage {
				err = a.forceUnstage(ctx, volume, e.MountDir, false)
			} else {
				err = a.mounts.RevokePublish(ctx, e.MountDir)
			}
			if err != nil {
				return fmt.Errorf("detach %s from %s: %w", volume, e.MountDir, err)
			}
			if err := a.fence.Release(ctx, volume, a.node, e.MountDir); err != nil {
				return fmt.Errorf("release %s at %s: %w", volume, e.MountDir, err)
			}
		}
	}
	a.log.Info("detached volume of a deleted cluster", "volume", volume)
	return nil
}

// heldDevice is staged, the device mounted at the volume's staging path,
// when sysfs names the volume's backing file for it ("" otherwise): the
// mount is in this node's mount table, so unlike a match by path alone it
// is never another node's device on a machine that shares one kernel.
func (a *Agent) heldDevice(volume string, d device, staged string) string {
	h, ok := d.(backingNamer)
	if !ok || staged == "" {
		return ""
	}
	if ok, err := h.Holds(volume, staged); err != nil || !ok {
		if err != nil {
			a.log.Error(err, "read the staged device's backing file", "volume", volume, "device", staged)
		}
		return ""
	}
	return staged
}

// lockBroken tells whether a stale entry's reason is another node taking
// the volume's lock over (and blocklisting this node's Ceph clients).
func lockBroken(r v1.CleanupReason) bool {
	return r == v1.ReasonNodeGone || r == v1.ReasonNodeOutOfService || r == v1.ReasonPodMoved
}

// prepareForceUnstage is prepareUnstage for a forced unstage. When the lock
// was broken, a ceph volume gets no new server: it would be a new Ceph
// client, not on the blocklist, and taking the connection over breaks the
// lock of the node that holds the volume now. A server still running is
// blocklisted (its I/O fails); with none, the connection is cut, so that
// the unmount's flush fails at once instead of waiting for a server.
func (a *Agent) prepareForceUnstage(ctx context.Context, volume string, d device, broken bool) error {
	if _, ceph := d.(cephClienter); !ceph || !broken {
		return a.prepareUnstage(ctx, volume, d)
	}
	if _, known := d.Serving(ctx, volume); known {
		return nil
	}
	a.log.Info("lock broken: cutting the connection of a ceph volume instead of starting a server", "volume", volume)
	return d.Stop(ctx, volume)
}
