package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/flexvolume"
	"github.com/berth-io/berth/internal/mount"
	"github.com/berth-io/berth/internal/volerr"
)

// Holdings lists what this node holds (the Attachments' entries).
type Holdings interface {
	ListForNode(ctx context.Context, node string) ([]fence.Hold, error)
}

// FlexConfig is what the Flexvolume path needs beyond the CSI path.
type FlexConfig struct {
	// StagingRoot holds one staging folder per volume mounted through
	// Flexvolume (kubelet stages nothing for Flexvolume drivers).
	StagingRoot string
	Holdings    Holdings
}

func (a *Agent) flexStaging(volume string) string {
	return filepath.Join(a.flex.StagingRoot, volume)
}

// FlexMount is Flexvolume's mount: stage the volume on this node (once) and
// bind it into the pod's mount dir, fenced like a CSI publish. It blocks
// until done. If the publish is refused, a stage this call made is undone.
func (a *Agent) FlexMount(ctx context.Context, r flexvolume.MountRequest) error {
	if a.flex.StagingRoot == "" {
		return fmt.Errorf("flexvolume: %w on this agent (no staging root)", ErrUnsupported)
	}
	if err := checkVolumeName(r.Volume); err != nil {
		return err
	}
	dir, err := a.paths.FlexMountDir(r.MountDir, flexvolume.Dir)
	if err != nil {
		return fmt.Errorf("flexvolume mount dir: %w: %w", err, volerr.ErrInvalid)
	}
	pod, err := a.flexPod(ctx, r, dir)
	if err != nil {
		return err
	}
	// From here on the pod is the one kubelet's mount dir names.
	r.PodNamespace, r.PodName, r.PodUID = pod.Namespace, pod.Name, string(pod.UID)
	// One lock over stage and publish: another pod's refused mount must
	// not unstage between this call's stage and its publish.
	unlock, err := a.lock(r.Volume)
	if err != nil {
		return err
	}
	defer unlock()
	if err := a.checkFlexOwner(ctx, r); err != nil {
		return err
	}
	if err := a.refuseCephFlex(ctx, r.Volume); err != nil {
		return err
	}
	staging := a.flexStaging(r.Volume)
	stagedBefore, _, err := a.mounts.StagedDevice(ctx, staging)
	if err != nil {
		return fmt.Errorf("check staging %s: %w", staging, err)
	}
	if err := a.stage(ctx, StageRequest{VolumeID: r.Volume, StagingPath: staging, FSType: r.FSType, ReadOnly: r.ReadOnly}); err != nil {
		return err
	}
	err = a.publish(ctx, PublishRequest{
		VolumeID: r.Volume, StagingPath: staging, TargetPath: r.MountDir, ReadOnly: r.ReadOnly,
		Pod: Pod{Namespace: r.PodNamespace, Name: r.PodName, UID: r.PodUID},
	})
	if err != nil && stagedBefore == "" {
		if uerr := a.unstage(context.WithoutCancel(ctx), r.Volume, staging); uerr != nil {
			a.log.Error(uerr, "unstage after refused flexvolume mount", "volume", r.Volume)
		}
	}
	return err
}

// FlexUnmount is Flexvolume's unmount: kubelet passes only the mount dir,
// so the volume is found by its entry in this node's Attachments. The
// volume is unstaged when no other mount of it is left on this node.
// Unmounting what is not mounted succeeds.
func (a *Agent) FlexUnmount(ctx context.Context, mountDir string) error {
	if a.flex.Holdings == nil {
		return fmt.Errorf("flexvolume: %w on this agent", ErrUnsupported)
	}
	if _, err := a.paths.FlexMountDir(mountDir, flexvolume.Dir); err != nil {
		return fmt.Errorf("flexvolume mount dir: %w: %w", err, volerr.ErrInvalid)
	}
	holds, err := a.flex.Holdings.ListForNode(ctx, a.node)
	if err != nil {
		return err
	}
	volume := ""
	for _, h := range holds {
		if !h.Entry.IsStage() && h.Entry.MountDir == mountDir {
			volume = h.Volume
		}
	}
	if volume == "" {
		return a.flexUnmountUnrecorded(ctx, mountDir)
	}
	if err := checkVolumeName(volume); err != nil {
		return err // an Attachment's name: it must not steer the staging path
	}
	unlock, err := a.lock(volume)
	if err != nil {
		return err
	}
	defer unlock()
	if err := a.unpublish(ctx, volume, mountDir); err != nil {
		return err
	}
	// Read again under the lock: who else still uses the volume here.
	if holds, err = a.flex.Holdings.ListForNode(ctx, a.node); err != nil {
		return err
	}
	for _, h := range holds {
		if h.Volume == volume && !h.Entry.IsStage() && h.Entry.MountDir != mountDir {
			return nil // another pod on this node still uses it
		}
	}
	staging := a.flexStaging(volume)
	return a.unstage(ctx, volume, staging)
}

// flexUnmountUnrecorded unmounts a mount dir that no Attachment entry names:
// a repeat after success, a mount dir berth never mounted, or a record that
// was lost (an Attachment deleted by hand, say). The mount table still tells
// what the dir shows: if it is one of berth's Flexvolume stagings, the
// volume is unstaged once no other pod's mount of it remains, so that a lost
// record never leaks a staging mount and a loop device.
func (a *Agent) flexUnmountUnrecorded(ctx context.Context, mountDir string) error {
	staging, err := a.mounts.StagingOf(ctx, mountDir, a.flex.StagingRoot)
	if err != nil {
		return fmt.Errorf("find the staging of %s: %w", mountDir, err)
	}
	if err := a.mounts.Unpublish(ctx, mountDir); err != nil {
		return fmt.Errorf("unmount %s: %w", mountDir, err)
	}
	if staging == "" {
		return nil
	}
	volume := filepath.Base(staging)
	if err := checkVolumeName(volume); err != nil {
		return nil // not a staging berth made: nothing of ours to release
	}
	unlock, err := a.lock(volume)
	if err != nil {
		return err
	}
	defer unlock()
	a.log.Info("flexvolume unmount without a record: releasing the staging the mount table names",
		"mountDir", mountDir, "volume", volume, "stagingPath", staging)
	if err := a.unstage(ctx, volume, staging); err != nil {
		if errors.Is(err, mount.ErrInUse) {
			a.log.Info("staging kept: still in use", "volume", volume, "reason", err.Error())
			return nil
		}
		return err
	}
	return nil
}

// Holds lists what this node holds, for the agent socket's list operation.
func (a *Agent) Holds(ctx context.Context) ([]fence.Hold, error) {
	if a.flex.Holdings == nil {
		return nil, fmt.Errorf("list: %w on this agent", ErrUnsupported)
	}
	return a.flex.Holdings.ListForNode(ctx, a.node)
}
