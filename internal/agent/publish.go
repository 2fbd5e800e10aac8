package agent

import (
	"context"
	"fmt"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/mount"
)

// Pod identifies the pod a publish is for; empty when unknown.
type Pod struct {
	Namespace, Name, UID string
}

// PublishRequest makes a staged volume visible at a pod's target path.
type PublishRequest struct {
	VolumeID    string
	StagingPath string
	TargetPath  string
	Block       bool
	ReadOnly    bool
	MountFlags  []string
	Pod         Pod
	// ShareDevice: as StageRequest's.
	ShareDevice bool
}

// Publish fences the volume for the pod (ReadWriteOncePod is decided here)
// and bind-mounts the staged volume (or its device) at the target path.
func (a *Agent) Publish(ctx context.Context, r PublishRequest) error {
	key := r.VolumeID
	if !r.ShareDevice && !r.Block {
		key = a.publishLock(ctx, r.VolumeID)
	}
	return a.withLock(key, func() error { return a.publish(ctx, r) })
}

// publish is Publish for a caller that holds the volume lock.
func (a *Agent) publish(ctx context.Context, r PublishRequest) (err error) {
	vol, err := a.readVolume(ctx, r.VolumeID)
	if err != nil {
		return err
	}
	if err := checkMode(vol, r.VolumeID, r.Block); err != nil {
		return err
	}
	if err := checkShareDevice(vol, r.VolumeID, r.ShareDevice, r.Block); err != nil {
		return err
	}
	if sharedFS(vol, r.Block) {
		// Any node may mount the share, wherever the image lives.
		return a.publishShared(ctx, r, vol)
	}
	if err := a.checkNode(ctx, vol); err != nil {
		return err
	}
	dev, block, err := a.mounts.StagedDevice(ctx, r.StagingPath)
	if err != nil {
		return fmt.Errorf("check staging path %s: %w", r.StagingPath, err)
	}
	if dev == "" || block != r.Block {
		return fmt.Errorf("volume %s at %s: %w", r.VolumeID, r.StagingPath, ErrNotStaged)
	}
	release, err := a.holdForPod(ctx, r, vol)
	if err != nil {
		return err
	}
	if err := a.mounts.Publish(ctx, mount.PublishRequest{
		VolumeID: r.VolumeID, StagingPath: r.StagingPath, TargetPath: r.TargetPath, Device: dev,
		Block: r.Block, ReadOnly: r.ReadOnly, MountFlags: r.MountFlags,
	}); err != nil {
		release()
		return fmt.Errorf("publish %s at %s: %w", r.VolumeID, r.TargetPath, err)
	}
	a.log.Info("published", "volume", r.VolumeID, "target", r.TargetPath, "pod", r.Pod.Namespace+"/"+r.Pod.Name)
	return nil
}

// holdForPod writes the pod's entry in the volume's Attachment, and returns
// what drops it again after a failed publish: nothing when the target was
// published before (a retry), which keeps its entry.
func (a *Agent) holdForPod(ctx context.Context, r PublishRequest, vol *v1.Volume) (release func(), err error) {
	claim := fence.Request{
		Volume: r.VolumeID, Node: a.node, PodNamespace: r.Pod.Namespace, Pod: r.Pod.Name, PodUID: r.Pod.UID,
		MountDir: r.TargetPath, StagingPath: r.StagingPath, AccessMode: vol.Spec.AccessMode, ReadOnly: r.ReadOnly,
		SoleDevice: shareDevice(vol, r.Block),
	}
	publishedBefore, err := a.mounts.IsMounted(ctx, r.TargetPath)
	if err != nil {
		return nil, fmt.Errorf("check target %s: %w", r.TargetPath, err)
	}
	if err := a.fence.Acquire(ctx, claim); err != nil {
		return nil, fmt.Errorf("fence volume %s: %w", r.VolumeID, err)
	}
	return func() {
		if publishedBefore {
			return
		}
		if err := a.fence.Release(context.WithoutCancel(ctx), r.VolumeID, a.node, r.TargetPath); err != nil {
			a.log.Error(err, "release fence after failed publish", "volume", r.VolumeID)
		}
	}, nil
}

// Unpublish unmounts the target path and drops the pod's record.
func (a *Agent) Unpublish(ctx context.Context, volumeID, targetPath string) error {
	return a.withLock(a.publishLock(ctx, volumeID), func() error { return a.unpublish(ctx, volumeID, targetPath) })
}

// UnpublishShareDevice is Unpublish for a request through the share
// manager's handle (volid.ShareDevice): its block device, under the
// volume's own lock.
func (a *Agent) UnpublishShareDevice(ctx context.Context, volumeID, targetPath string) error {
	return a.withLock(volumeID, func() error { return a.unpublish(ctx, volumeID, targetPath) })
}

// unpublish is Unpublish for a caller that holds the volume lock.
func (a *Agent) unpublish(ctx context.Context, volumeID, targetPath string) error {
	if err := a.mounts.Unpublish(ctx, targetPath); err != nil {
		return fmt.Errorf("unpublish %s: %w", targetPath, err)
	}
	if err := a.fence.Release(ctx, volumeID, a.node, targetPath); err != nil {
		return fmt.Errorf("release fence of %s: %w", volumeID, err)
	}
	a.log.Info("unpublished", "volume", volumeID, "target", targetPath)
	return nil
}
