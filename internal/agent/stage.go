package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/blockdev"
	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/mount"
	"github.com/berth-io/berth/internal/volerr"
)

// StageRequest stages a volume on this node.
type StageRequest struct {
	VolumeID    string
	StagingPath string
	// FSType overrides the Volume's fs type when set.
	FSType     string
	MountFlags []string
	Block      bool
	ReadOnly   bool
}

// Stage fences the volume for this node, attaches its image as a block
// device, and (filesystem volumes) formats it when blank and mounts it at
// the staging path. A retry after a crash between steps reuses the loop
// device and mount that exist. On failure, what this call made is undone.
func (a *Agent) Stage(ctx context.Context, r StageRequest) error {
	unlock, err := a.lock(r.VolumeID)
	if err != nil {
		return err
	}
	defer unlock()
	return a.stage(ctx, r)
}

// stage is Stage for a caller that holds the volume lock.
func (a *Agent) stage(ctx context.Context, r StageRequest) (err error) {
	log := a.log.WithValues("volume", r.VolumeID, "stagingPath", r.StagingPath)

	vol, err := a.volume(ctx, r.VolumeID)
	if err != nil {
		return err
	}
	sc, err := a.clusterLive(ctx, vol)
	if err != nil {
		return err
	}
	userspace := vol.Spec.Mounter == v1.MounterUserspace
	if userspace && a.us == nil {
		return fmt.Errorf("volume %s: mounter userspace: %w on this agent", r.VolumeID, ErrUnsupported)
	}
	overNBD := userspace && a.stageTransport(r.VolumeID, sc) == TransportNBD
	if overNBD {
		// Refused before anything is made: the hold, a server, a record.
		if ok, reason := a.us.NBD.Available(); !ok {
			return nbdUnavailable(r.VolumeID, reason)
		}
	}
	if r.Block != (vol.Spec.VolumeMode == v1.VolumeModeBlock) {
		return fmt.Errorf("volume %s is %s, the request asks otherwise: %w", r.VolumeID, vol.Spec.VolumeMode, volerr.ErrInvalid)
	}
	image, err := a.imagePath(ctx, r.VolumeID)
	if err != nil {
		return err
	}
	// A volume already staged here (a retry, or a second Flexvolume pod)
	// must survive a failed call: only what this call made is undone.
	stagedDev, _, err := a.mounts.StagedDevice(ctx, r.StagingPath)
	if err != nil {
		return fmt.Errorf("check staging path %s: %w", r.StagingPath, err)
	}
	claim := fence.Request{
		Volume: r.VolumeID, Node: a.node, MountDir: r.StagingPath, StagingPath: r.StagingPath,
		AccessMode: vol.Spec.AccessMode, ReadOnly: r.ReadOnly,
	}
	if err := a.fence.Acquire(ctx, claim); err != nil {
		return fmt.Errorf("fence volume %s: %w", r.VolumeID, err)
	}
	// attached and fresh say what existed before this call, so that a failed
	// retry of a stage never undoes the stage that succeeded before.
	backing, attached, fresh := image, true, false
	// madeDev is the loop device this call attached: detaching it needs no
	// look-up by backing file, which would wait on a dead userspace server.
	var madeDev string
	defer func() {
		if err == nil || stagedDev != "" {
			return
		}
		// Leave nothing half made: a failed stage is as if it never ran.
		if !attached {
			dev, found, ferr := madeDev, madeDev != "", error(nil)
			if !found {
				dev, found, ferr = a.loop.Find(context.WithoutCancel(ctx), backing)
			}
			if ferr == nil && found {
				if derr := a.loop.Detach(context.WithoutCancel(ctx), dev); derr != nil {
					log.Error(derr, "detach after failed stage", "device", dev)
				}
			}
		}
		if fresh {
			if serr := a.stopUserspace(context.WithoutCancel(ctx), r.VolumeID); serr != nil {
				log.Error(serr, "stop blockdev server after failed stage")
			}
		}
		if rerr := a.fence.Release(context.WithoutCancel(ctx), r.VolumeID, a.node, r.StagingPath); rerr != nil {
			log.Error(rerr, "release fence after failed stage")
		}
	}()
	// Checked again now that the hold is written: a cluster cleanup that
	// listed this node's holds before it did saw the deletion before this
	// read, so either it detaches this stage or this stage stops here.
	if _, err := a.clusterLive(ctx, vol); err != nil {
		return err
	}
	if overNBD {
		_, had, err := a.us.NBD.Device(r.VolumeID)
		if err != nil {
			return fmt.Errorf("find nbd device of %s: %w", r.VolumeID, err)
		}
		fresh = !had
		if _, err := a.nbdEnsureServer(ctx, r.VolumeID, image); err != nil {
			return err
		}
		dev, err := a.nbdDevice(r.VolumeID)
		if err != nil {
			return err
		}
		return a.stageDevice(ctx, r, vol, dev)
	}
	if userspace {
		_, held, err := a.server(ctx, r.VolumeID)
		if err != nil {
			return err
		}
		fresh = !held
		if err := a.ensureServer(ctx, r.VolumeID, image); err != nil {
			return err
		}
		backing = filepath.Join(a.usMountpoint(r.VolumeID), blockdev.FileName)
	}
	_, attached, err = a.loop.Find(ctx, backing)
	if err != nil {
		return fmt.Errorf("find loop device of %s: %w", backing, err)
	}
	dev, err := a.loop.Attach(ctx, backing, r.ReadOnly)
	if err != nil {
		return fmt.Errorf("attach %s: %w", backing, err)
	}
	if !attached {
		madeDev = dev
	}
	return a.stageDevice(ctx, r, vol, dev)
}

// stageDevice formats (when blank) and mounts the volume's block device at
// the staging path, or binds it there for a block volume.
func (a *Agent) stageDevice(ctx context.Context, r StageRequest, vol *v1.Volume, dev string) error {
	fsType := vol.Spec.FSType
	if r.FSType != "" {
		fsType = r.FSType
	}
	var format mount.FormatPolicy
	if !r.Block {
		var err error
		if format, err = a.formatPolicy(ctx, vol); err != nil {
			return err
		}
	}
	if err := a.mounts.Stage(ctx, mount.StageRequest{
		VolumeID: r.VolumeID, Device: dev, StagingPath: r.StagingPath, FSType: fsType,
		MountFlags: r.MountFlags, Block: r.Block, ReadOnly: r.ReadOnly, Format: format,
	}); err != nil {
		return fmt.Errorf("stage %s on %s: %w", dev, r.StagingPath, err)
	}
	if !r.Block {
		// The volume is staged and in use from here: a failed record does
		// not undo that. The next stage writes it again, and until then
		// mount's content check still refuses to format an image with data.
		if err := a.recordFormat(ctx, vol, fsType); err != nil {
			a.log.Error(err, "volume staged, but its format is not recorded", "volume", r.VolumeID)
		}
	}
	// Status tells; it holds nothing: a failed write does not undo the stage.
	if err := a.fence.ReportStaged(ctx, r.VolumeID, fence.Staged{Node: a.node, DevicePath: dev, StagingPath: r.StagingPath}); err != nil {
		a.log.Error(err, "volume staged, but the Attachment status does not say so", "volume", r.VolumeID)
	}
	a.log.Info("staged", "volume", r.VolumeID, "stagingPath", r.StagingPath, "device", dev)
	return nil
}

// Unstage refuses while the volume is still published or its device is
// open; then it unmounts, detaches the loop device and drops this node's
// stage record.
func (a *Agent) Unstage(ctx context.Context, volumeID, stagingPath string) error {
	unlock, err := a.lock(volumeID)
	if err != nil {
		return err
	}
	defer unlock()
	return a.unstage(ctx, volumeID, stagingPath)
}

// unstage is Unstage for a caller that holds the volume lock.
func (a *Agent) unstage(ctx context.Context, volumeID, stagingPath string) error {
	if err := a.prepareUnstage(ctx, volumeID); err != nil {
		return fmt.Errorf("unstage %s: %w", volumeID, err)
	}
	dev, err := a.mounts.Unstage(ctx, stagingPath)
	if err != nil {
		a.reportHeldOpen(ctx, volumeID, err)
		return fmt.Errorf("unstage %s: %w", stagingPath, err)
	}
	if dev == "" {
		// Nothing mounted: a retry after a crash between unmount and detach
		// finds the loop device by its backing file.
		if dev, err = a.attachedDevice(ctx, volumeID); err != nil {
			return err
		}
	}
	if err := a.detach(ctx, volumeID, dev); err != nil {
		return err
	}
	if err := a.stopUserspace(ctx, volumeID); err != nil {
		return fmt.Errorf("unstage %s: %w", volumeID, err)
	}
	if err := a.fence.Release(ctx, volumeID, a.node, stagingPath); err != nil {
		return fmt.Errorf("release fence of %s: %w", volumeID, err)
	}
	if err := a.fence.ReportStaged(ctx, volumeID, fence.Staged{Node: a.node}); err != nil {
		a.log.Error(err, "volume unstaged, but the Attachment status still names this node", "volume", volumeID)
	}
	a.log.Info("unstaged", "volume", volumeID, "stagingPath", stagingPath, "device", dev)
	return nil
}

// detach detaches the volume's loop device, if it has one: an nbd device
// goes with its server (stopUserspace).
func (a *Agent) detach(ctx context.Context, volumeID, dev string) error {
	if dev == "" || a.isNBD(volumeID) {
		return nil
	}
	if err := a.loop.Detach(ctx, dev); err != nil {
		return fmt.Errorf("detach %s: %w", dev, err)
	}
	return nil
}

// attachedDevice returns the volume's block device on this node: the loop
// device on its backing file or its nbd device; "" when none is (or the
// image is gone).
func (a *Agent) attachedDevice(ctx context.Context, volumeID string) (string, error) {
	if a.isNBD(volumeID) {
		dev, found, err := a.us.NBD.Device(volumeID)
		if err != nil || !found {
			return "", err
		}
		return dev, nil
	}
	image, err := a.backingFile(ctx, volumeID)
	if errors.Is(err, ErrVolumeNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	dev, found, err := a.loop.Find(ctx, image)
	if err != nil {
		return "", fmt.Errorf("find loop device of %s: %w", image, err)
	}
	if !found {
		return "", nil
	}
	return dev, nil
}
