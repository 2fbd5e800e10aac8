package agent

import (
	"context"
	"fmt"

	v1 "github.com/berth-io/berth/api/v1alpha1"
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
	// ShareDevice: the request names the volume by its share manager's
	// handle (volid.ShareDevice), which only the block stage of a
	// read-write-many filesystem volume may.
	ShareDevice bool
	// Secrets are the stage secrets (kubelet's NodeStageVolume): a ceph
	// volume's cephx client. Never logged.
	Secrets map[string]string
}

// Stage fences the volume for this node, attaches its image as a block
// device, and (filesystem volumes) formats it when blank and mounts it at
// the staging path. A retry after a crash between steps reuses the loop
// device and mount that exist. On failure, what this call made is undone.
func (a *Agent) Stage(ctx context.Context, r StageRequest) error {
	return a.withLock(r.VolumeID, func() error { return a.stage(ctx, r) })
}

// withLock runs fn holding the lock of volume: the CSI entry points (Stage,
// Unstage, Publish, Unpublish) each run their locked counterpart this way.
func (a *Agent) withLock(volume string, fn func() error) error {
	unlock, err := a.lock(volume)
	if err != nil {
		return err
	}
	defer unlock()
	return fn()
}

// stage is Stage for a caller that holds the volume lock.
func (a *Agent) stage(ctx context.Context, r StageRequest) (err error) {
	vol, err := a.readVolume(ctx, r.VolumeID)
	if err != nil {
		return err
	}
	if err := checkShareDevice(vol, r.VolumeID, r.ShareDevice, r.Block); err != nil {
		return err
	}
	if sharedFS(vol, r.Block) {
		// A workload's stage: the share manager holds the device, and
		// publish mounts its share.
		a.log.Info("staged (shared over NFS: nothing on this node's devices)", "volume", r.VolumeID, "stagingPath", r.StagingPath)
		return nil
	}
	if err := a.checkNode(ctx, vol); err != nil {
		return err
	}
	sc, err := a.clusterLive(ctx, vol)
	if err != nil {
		return err
	}
	// The transport is chosen once: a volume staged here keeps its own.
	rec, staged, err := a.records().load(r.VolumeID)
	if err != nil {
		return err
	}
	transport := rec.Transport
	if !staged {
		transport = a.chooseTransport(vol, sc)
	}
	d, err := a.deviceFor(r.VolumeID, transport)
	if err != nil {
		return err
	}
	// Refused before anything is made: a hold, a server, a record.
	if err := d.Check(r.VolumeID); err != nil {
		return err
	}
	if !staged {
		if err := a.netns.check(r.VolumeID, sc); err != nil {
			return err
		}
	}
	if err := checkMode(vol, r.VolumeID, r.Block); err != nil {
		return err
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
	// The agent asks the operator to break locks (fence.Options.AskOperator),
	// which blocklists with its own key; Ceph has the Fencer refuse at once
	// to ask for a lock whose holder's clients could not be fenced.
	claim := fence.Request{
		Volume: r.VolumeID, Node: a.node, MountDir: r.StagingPath, StagingPath: r.StagingPath,
		AccessMode: vol.Spec.AccessMode, ReadOnly: r.ReadOnly, SoleDevice: shareDevice(vol, r.Block),
		Ceph: sc != nil && sc.Spec.Backend == v1.BackendCeph && sc.Spec.Ceph != nil,
	}
	if err = a.fence.Acquire(ctx, claim); err != nil {
		return fmt.Errorf("fence volume %s: %w", r.VolumeID, err)
	}
	// att and recorded say what this call made, so that a failed retry of
	// a stage never undoes the stage that succeeded before.
	var att attachment
	var recorded bool
	defer func() {
		if err == nil || stagedDev != "" {
			return
		}
		// Leave nothing half made: a failed stage is as if it never ran.
		a.undoStage(context.WithoutCancel(ctx), r, d, att, recorded)
	}()
	// Checked again now that the hold is written: a cluster cleanup that
	// listed this node's holds before it did saw the deletion before this
	// read, so either it detaches this stage or this stage stops here.
	if _, err := a.clusterLive(ctx, vol); err != nil {
		return err
	}
	if recorded, err = a.records().create(r.VolumeID, transport); err != nil {
		return err
	}
	if att, err = d.Attach(ctx, attachRequest{Volume: r.VolumeID, Image: image, ReadOnly: r.ReadOnly, Cluster: sc, Secrets: r.Secrets}); err != nil {
		return err
	}
	// Unknown addresses could never be fenced: no stage without them, and
	// none before they are recorded (F3). A lock broken while they are
	// not would fence nothing, and this node could write beside the next.
	clients, err := cephClientsOf(d, r.VolumeID)
	if err != nil {
		return err
	}
	if _, ceph := d.(cephClienter); ceph && len(clients) == 0 {
		return fmt.Errorf("volume %s: its server reported no ceph client address, which fencing needs: %w", r.VolumeID, volerr.ErrUnavailable)
	}
	if len(clients) > 0 {
		if err := a.fence.ReportStaged(ctx, r.VolumeID, fence.Staged{Node: a.node, DevicePath: att.Device,
			StagingPath: r.StagingPath, CephClients: clients}); err != nil {
			return fmt.Errorf("volume %s: record its ceph clients %v before its device is used: %w", r.VolumeID, clients, err)
		}
	}
	return a.stageDevice(ctx, r, vol, sc, att.Device, clients)
}

// undoStage undoes what a failed stage made: the device it attached (by
// the path Attach returned, which needs no look-up that would wait on a
// dead userspace server), the servers and connection it made, the record
// and the hold.
func (a *Agent) undoStage(ctx context.Context, r StageRequest, d device, att attachment, recorded bool) {
	log := a.log.WithValues("volume", r.VolumeID, "stagingPath", r.StagingPath)
	if att.NewDevice {
		dev, err := att.Device, error(nil)
		if dev == "" {
			dev, err = d.Find(ctx, r.VolumeID)
		}
		if err == nil && dev != "" {
			if err := d.Detach(ctx, r.VolumeID, dev); err != nil {
				log.Error(err, "detach after failed stage", "device", dev)
			}
		}
	}
	switch {
	case att.NewConnection:
		if err := a.stopDevice(ctx, r.VolumeID, d); err != nil {
			log.Error(err, "stop blockdev server after failed stage")
		}
	case recorded && !att.Pending:
		if err := a.records().remove(r.VolumeID); err != nil {
			log.Error(err, "remove record after failed stage")
		}
	}
	if err := a.fence.Release(ctx, r.VolumeID, a.node, r.StagingPath); err != nil {
		log.Error(err, "release fence after failed stage")
	}
}

// stageDevice formats (when blank) and mounts the volume's block device at
// the staging path, or binds it there for a block volume.
// clients are the Ceph client addresses serving it (none for other backends).
func (a *Agent) stageDevice(ctx context.Context, r StageRequest, vol *v1.Volume, sc *v1.StorageCluster, dev string, clients []string) error {
	fsType := vol.Spec.FSType
	if r.FSType != "" {
		fsType = r.FSType
	}
	var format mount.FormatPolicy
	var recs FormatRecords
	if !r.Block {
		var closeRecs func()
		var err error
		if recs, closeRecs, err = a.formatRecords(ctx, vol, sc, r.Secrets); err != nil {
			return err
		}
		defer closeRecs()
		if format, err = a.formatPolicy(ctx, vol, recs); err != nil {
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
		if err := a.recordFormat(ctx, vol, fsType, recs); err != nil {
			a.log.Error(err, "volume staged, but its format is not recorded", "volume", r.VolumeID)
		}
	}
	// Status tells; it holds nothing: a failed write does not undo the stage.
	err := a.fence.ReportStaged(ctx, r.VolumeID, fence.Staged{Node: a.node, DevicePath: dev, StagingPath: r.StagingPath, CephClients: clients})
	a.reports.set(r.VolumeID, err == nil)
	if err != nil {
		a.log.Error(err, "volume staged, but the Attachment status does not say so", "volume", r.VolumeID)
	}
	a.log.Info("staged", "volume", r.VolumeID, "stagingPath", r.StagingPath, "device", dev)
	return nil
}

// Unstage refuses while the volume is still published or its device is
// open; then it unmounts, detaches the loop device and drops this node's
// stage record.
func (a *Agent) Unstage(ctx context.Context, volumeID, stagingPath string) error {
	return a.withLock(volumeID, func() error { return a.unstage(ctx, volumeID, stagingPath) })
}

// unstage is Unstage for a caller that holds the volume lock.
func (a *Agent) unstage(ctx context.Context, volumeID, stagingPath string) error {
	if workload, err := a.workloadStage(ctx, volumeID, stagingPath); err != nil || workload {
		return err
	}
	d, err := a.device(volumeID)
	if err != nil {
		return fmt.Errorf("unstage %s: %w", volumeID, err)
	}
	if err := a.prepareUnstage(ctx, volumeID, d); err != nil {
		return fmt.Errorf("unstage %s: %w", volumeID, err)
	}
	dev, err := a.mounts.Unstage(ctx, stagingPath)
	if err != nil {
		a.reportHeldOpen(ctx, volumeID, err)
		return fmt.Errorf("unstage %s: %w", stagingPath, err)
	}
	if dev == "" {
		// Nothing mounted: a retry after a crash between unmount and detach
		// finds the device by the volume.
		if dev, err = d.Find(ctx, volumeID); err != nil {
			return err
		}
	}
	if dev != "" {
		if err := d.Detach(ctx, volumeID, dev); err != nil {
			return err
		}
	}
	if err := a.stopDevice(ctx, volumeID, d); err != nil {
		return fmt.Errorf("unstage %s: %w", volumeID, err)
	}
	if err := a.fence.Release(ctx, volumeID, a.node, stagingPath); err != nil {
		return fmt.Errorf("release fence of %s: %w", volumeID, err)
	}
	if err := a.fence.ReportStaged(ctx, volumeID, fence.Staged{Node: a.node}); err != nil {
		a.log.Error(err, "volume unstaged, but the Attachment status still names this node", "volume", volumeID)
	}
	a.reports.set(volumeID, false)
	a.log.Info("unstaged", "volume", volumeID, "stagingPath", stagingPath, "device", dev)
	return nil
}

// attachedDevice returns the volume's block device on this node; "" when
// none is (or the image is gone).
func (a *Agent) attachedDevice(ctx context.Context, volumeID string) (string, error) {
	d, err := a.device(volumeID)
	if err != nil {
		return "", err
	}
	return d.Find(ctx, volumeID)
}
