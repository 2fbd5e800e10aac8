// Package agent is the node agent's core: the volume operations that both
// the CSI node service and the Flexvolume driver (through the agent socket)
// call. Each operation takes the volume's lock, fences through the
// Attachment, then attaches, mounts or undoes that.
package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/blockdev"
	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/mount"
)

// Images finds a volume's backend image on this node.
type Images interface {
	Get(ctx context.Context, id string) (backend.Image, error)
}

// Fencer records and checks who holds a volume (internal/fence).
type Fencer interface {
	Acquire(ctx context.Context, r fence.Request) error
	Release(ctx context.Context, volume, node, mountDir string) error
}

// Agent runs volume operations on one node.
type Agent struct {
	node   string
	api    client.Reader
	images Images
	loop   mount.Loop
	mounts *mount.Manager
	fence  Fencer
	locks  *VolumeLocks
	log    logr.Logger
	flex   FlexConfig
	us     *UserspaceConfig
}

// New returns the agent of node. api reads Volume objects (uncached, so that
// a volume made a moment ago is found).
func New(node string, api client.Reader, images Images, loop mount.Loop, mounts *mount.Manager, f Fencer, locks *VolumeLocks, log logr.Logger) *Agent {
	return &Agent{node: node, api: api, images: images, loop: loop, mounts: mounts, fence: f, locks: locks, log: log}
}

// Node is the node this agent serves.
func (a *Agent) Node() string { return a.node }

// Locks are the per-volume locks, shared with the healer.
func (a *Agent) Locks() *VolumeLocks { return a.locks }

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
}

func (a *Agent) lock(volume string) (func(), error) {
	if !a.locks.TryLock(volume) {
		return nil, fmt.Errorf("volume %s: %w", volume, ErrBusy)
	}
	return func() { a.locks.Unlock(volume) }, nil
}

// volume reads the Volume object and checks that it lives here.
func (a *Agent) volume(ctx context.Context, id string) (*v1.Volume, error) {
	vol := &v1.Volume{}
	if err := a.api.Get(ctx, client.ObjectKey{Name: id}, vol); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("volume %s: %w", id, ErrVolumeNotFound)
		}
		return nil, fmt.Errorf("read Volume %s: %w", id, err)
	}
	if vol.Spec.Node != "" && vol.Spec.Node != a.node {
		return nil, fmt.Errorf("volume %s is on node %s, this is %s: %w", id, vol.Spec.Node, a.node, ErrWrongNode)
	}
	return vol, nil
}

// clusterLive refuses a volume whose StorageCluster is being deleted: its
// agents are detaching everything of it. A cluster that does not exist
// (yet) does not stop a stage.
func (a *Agent) clusterLive(ctx context.Context, vol *v1.Volume) error {
	if vol.Spec.StorageCluster == "" {
		return nil
	}
	sc := &v1.StorageCluster{}
	if err := a.api.Get(ctx, client.ObjectKey{Name: vol.Spec.StorageCluster}, sc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("read StorageCluster %s: %w", vol.Spec.StorageCluster, err)
	}
	if !sc.DeletionTimestamp.IsZero() {
		return fmt.Errorf("volume %s: storage cluster %s: %w", vol.Name, sc.Name, ErrClusterDeleting)
	}
	return nil
}

func (a *Agent) imagePath(ctx context.Context, id string) (string, error) {
	img, err := a.images.Get(ctx, id)
	if err != nil {
		if errors.Is(err, backend.ErrNotFound) {
			return "", fmt.Errorf("image of volume %s: %w", id, ErrVolumeNotFound)
		}
		return "", fmt.Errorf("image of volume %s: %w", id, err)
	}
	return img.Path, nil
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
	if err := a.clusterLive(ctx, vol); err != nil {
		return err
	}
	userspace := vol.Spec.Mounter == v1.MounterUserspace
	if userspace && a.us == nil {
		return fmt.Errorf("volume %s: mounter userspace: %w on this agent", r.VolumeID, ErrUnsupported)
	}
	if userspace && a.transport(r.VolumeID) == TransportNBD {
		// Refused before anything is made: the hold, a server, a record.
		if ok, reason := a.us.NBD.Available(); !ok {
			return fmt.Errorf("volume %s: %w (%s); set the agent's userspace transport to %s", r.VolumeID, ErrNBDUnavailable, reason, TransportFUSE)
		}
	}
	if r.Block != (vol.Spec.VolumeMode == v1.VolumeModeBlock) {
		return fmt.Errorf("volume %s is %s, the request asks otherwise: %w", r.VolumeID, vol.Spec.VolumeMode, mount.ErrInvalid)
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
	defer func() {
		if err == nil || stagedDev != "" {
			return
		}
		// Leave nothing half made: a failed stage is as if it never ran.
		if !attached {
			if dev, found, ferr := a.loop.Find(context.WithoutCancel(ctx), backing); ferr == nil && found {
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
	if err := a.clusterLive(ctx, vol); err != nil {
		return err
	}
	if userspace && a.transport(r.VolumeID) == TransportNBD {
		_, had, err := a.us.NBD.Device(r.VolumeID)
		if err != nil {
			return fmt.Errorf("find nbd device of %s: %w", r.VolumeID, err)
		}
		fresh = !had
		if err := a.nbdEnsureServer(ctx, r.VolumeID, image); err != nil {
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
	return a.stageDevice(ctx, r, vol, dev)
}

// stageDevice formats (when blank) and mounts the volume's block device at
// the staging path, or binds it there for a block volume.
func (a *Agent) stageDevice(ctx context.Context, r StageRequest, vol *v1.Volume, dev string) error {
	fsType := vol.Spec.FSType
	if r.FSType != "" {
		fsType = r.FSType
	}
	if err := a.mounts.Stage(ctx, mount.StageRequest{
		VolumeID: r.VolumeID, Device: dev, StagingPath: r.StagingPath, FSType: fsType,
		MountFlags: r.MountFlags, Block: r.Block, ReadOnly: r.ReadOnly,
	}); err != nil {
		return fmt.Errorf("stage %s on %s: %w", dev, r.StagingPath, err)
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
	if a.isUserspace(volumeID) {
		if err := a.stopUserspace(ctx, volumeID); err != nil {
			return fmt.Errorf("unstage %s: %w", volumeID, err)
		}
	}
	if err := a.fence.Release(ctx, volumeID, a.node, stagingPath); err != nil {
		return fmt.Errorf("release fence of %s: %w", volumeID, err)
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

// Publish fences the volume for the pod (ReadWriteOncePod is decided here)
// and bind-mounts the staged volume (or its device) at the target path.
func (a *Agent) Publish(ctx context.Context, r PublishRequest) error {
	unlock, err := a.lock(r.VolumeID)
	if err != nil {
		return err
	}
	defer unlock()
	return a.publish(ctx, r)
}

// publish is Publish for a caller that holds the volume lock.
func (a *Agent) publish(ctx context.Context, r PublishRequest) (err error) {
	vol, err := a.volume(ctx, r.VolumeID)
	if err != nil {
		return err
	}
	if r.Block != (vol.Spec.VolumeMode == v1.VolumeModeBlock) {
		return fmt.Errorf("volume %s is %s, the request asks otherwise: %w", r.VolumeID, vol.Spec.VolumeMode, mount.ErrInvalid)
	}
	dev, block, err := a.mounts.StagedDevice(ctx, r.StagingPath)
	if err != nil {
		return fmt.Errorf("check staging path %s: %w", r.StagingPath, err)
	}
	if dev == "" || block != r.Block {
		return fmt.Errorf("volume %s at %s: %w", r.VolumeID, r.StagingPath, ErrNotStaged)
	}
	claim := fence.Request{
		Volume: r.VolumeID, Node: a.node, PodNamespace: r.Pod.Namespace, Pod: r.Pod.Name, PodUID: r.Pod.UID,
		MountDir: r.TargetPath, StagingPath: r.StagingPath, AccessMode: vol.Spec.AccessMode, ReadOnly: r.ReadOnly,
	}
	// A target already published (a retry) keeps its record if this call fails.
	publishedBefore, err := a.mounts.IsMounted(ctx, r.TargetPath)
	if err != nil {
		return fmt.Errorf("check target %s: %w", r.TargetPath, err)
	}
	if err := a.fence.Acquire(ctx, claim); err != nil {
		return fmt.Errorf("fence volume %s: %w", r.VolumeID, err)
	}
	if err := a.mounts.Publish(ctx, mount.PublishRequest{
		VolumeID: r.VolumeID, StagingPath: r.StagingPath, TargetPath: r.TargetPath, Device: dev,
		Block: r.Block, ReadOnly: r.ReadOnly, MountFlags: r.MountFlags,
	}); err != nil {
		if publishedBefore {
			return fmt.Errorf("publish %s at %s: %w", r.VolumeID, r.TargetPath, err)
		}
		if rerr := a.fence.Release(context.WithoutCancel(ctx), r.VolumeID, a.node, r.TargetPath); rerr != nil {
			a.log.Error(rerr, "release fence after failed publish", "volume", r.VolumeID)
		}
		return fmt.Errorf("publish %s at %s: %w", r.VolumeID, r.TargetPath, err)
	}
	a.log.Info("published", "volume", r.VolumeID, "target", r.TargetPath, "pod", r.Pod.Namespace+"/"+r.Pod.Name)
	return nil
}

// Unpublish unmounts the target path and drops the pod's record.
func (a *Agent) Unpublish(ctx context.Context, volumeID, targetPath string) error {
	unlock, err := a.lock(volumeID)
	if err != nil {
		return err
	}
	defer unlock()
	return a.unpublish(ctx, volumeID, targetPath)
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

// Expand grows the loop device to the image's new size and then the
// filesystem mounted at path (none for block volumes). It returns the size.
func (a *Agent) Expand(ctx context.Context, volumeID, path string, block bool) (int64, error) {
	unlock, err := a.lock(volumeID)
	if err != nil {
		return 0, err
	}
	defer unlock()
	img, err := a.images.Get(ctx, volumeID)
	if err != nil {
		if errors.Is(err, backend.ErrNotFound) {
			return 0, fmt.Errorf("volume %s: %w", volumeID, ErrVolumeNotFound)
		}
		return 0, err
	}
	if a.isNBD(volumeID) {
		// The kernel sets an nbd device's size at connect only.
		return 0, fmt.Errorf("volume %s is served over nbd, whose size the kernel fixes at connect: "+
			"online expansion is %w; the new size applies when the volume is staged again", volumeID, ErrUnsupported)
	}
	backing, err := a.backingFile(ctx, volumeID)
	if err != nil {
		return 0, err
	}
	dev, found, err := a.loop.Find(ctx, backing)
	if err != nil {
		return 0, fmt.Errorf("find loop device of %s: %w", backing, err)
	}
	if !found {
		return 0, fmt.Errorf("volume %s: %w", volumeID, ErrNotStaged)
	}
	if err := a.loop.Refresh(ctx, dev); err != nil {
		return 0, fmt.Errorf("refresh %s: %w", dev, err)
	}
	if !block {
		if err := a.mounts.Expand(ctx, dev, path); err != nil {
			return 0, fmt.Errorf("grow filesystem at %s: %w", path, err)
		}
	}
	return img.Size, nil
}

// Stats reports usage of a published or staged path.
func (a *Agent) Stats(ctx context.Context, volumeID, path string) (mount.Stats, error) {
	if _, err := a.images.Get(ctx, volumeID); err != nil {
		if errors.Is(err, backend.ErrNotFound) {
			return mount.Stats{}, fmt.Errorf("volume %s: %w", volumeID, ErrVolumeNotFound)
		}
		return mount.Stats{}, err
	}
	return a.mounts.Stats(ctx, path)
}

// Condition tells whether the volume at path is healthy; for a userspace
// volume also whether its keeper, connection and server are.
func (a *Agent) Condition(ctx context.Context, volumeID, path string) (abnormal bool, msg string) {
	if a.isUserspace(volumeID) {
		if abnormal, msg := a.usCondition(ctx, volumeID); abnormal {
			return abnormal, msg
		}
	}
	return a.mounts.Condition(ctx, path)
}
