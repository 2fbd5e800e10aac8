package mount

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	mountutils "k8s.io/mount-utils"

	"github.com/berth-io/berth/internal/volerr"
)

// Publish binds a staged volume onto TargetPath: the staging dir onto a
// directory, or (Block) the device node onto a file. A TargetPath of the
// wrong type is volerr.ErrInvalid and nothing changes. Published again with the
// same parameters is success.
func (m *Manager) Publish(ctx context.Context, r PublishRequest) error {
	if err := absPath("target path", r.TargetPath); err != nil {
		return err
	}
	if r.Block {
		return m.publishBlock(r)
	}
	if err := absPath("staging path", r.StagingPath); err != nil {
		return err
	}
	target, staging := canonical(r.TargetPath), canonical(r.StagingPath)
	if err := m.clearTombstone(target); err != nil {
		return err
	}
	if fi, err := os.Stat(target); err == nil && !fi.IsDir() {
		return fmt.Errorf("target %s exists and is not a directory: %w", target, volerr.ErrInvalid)
	}
	mis, err := m.mountInfo()
	if err != nil {
		return err
	}
	src := mountAt(mis, staging)
	if src == nil {
		return fmt.Errorf("nothing mounted at %s: %w", staging, ErrNotStaged)
	}
	if done, err := m.checkPublished(mis, target, src, r.ReadOnly); done || err != nil {
		return err
	}
	if err := mkdirTarget(target); err != nil {
		return err
	}
	opts := append([]string{"bind"}, r.MountFlags...)
	if r.ReadOnly {
		opts = append(opts, "ro")
	}
	// mount-utils binds, then remounts with the other options (bind mounts
	// ignore them on the first call).
	if err := m.mounter.Mount(staging, target, "", opts); err != nil {
		return fmt.Errorf("bind %s to %s: %w", staging, target, err)
	}
	m.log.Info("published", "volume", r.VolumeID, "target", target, "readOnly", r.ReadOnly)
	return nil // done: a deadline passing now must not turn success into failure
}

// checkPublished reports whether target already shows what want shows, with
// the asked read-only mode; another mount there is ErrExists. A stale mount
// is removed so that the caller mounts afresh.
func (m *Manager) checkPublished(mis []mountutils.MountInfo, target string, want *mountutils.MountInfo, readOnly bool) (bool, error) {
	have := mountAt(mis, target)
	if have == nil {
		return false, nil
	}
	if _, err := os.Stat(target); mountutils.IsCorruptedMnt(err) {
		m.log.Info("unmounting stale target", "path", target, "err", err.Error())
		return false, m.unmountAll(target)
	}
	if have.Major != want.Major || have.Minor != want.Minor || have.Root != want.Root {
		return false, fmt.Errorf("%s already holds another mount (%d:%d %s): %w", target, have.Major, have.Minor, have.Root, ErrExists)
	}
	if isReadOnly(have.MountOptions) != readOnly {
		return false, fmt.Errorf("%s is published with read-only=%t, asked %t: %w", target, !readOnly, readOnly, ErrExists)
	}
	return true, nil
}

func (m *Manager) publishBlock(r PublishRequest) error {
	target := canonical(r.TargetPath)
	if fi, err := os.Stat(target); err == nil && fi.IsDir() {
		return fmt.Errorf("target %s exists and is a directory: %w", target, volerr.ErrInvalid)
	}
	mis, err := m.mountInfo()
	if err != nil {
		return err
	}
	dev := r.Device
	staged := mountAt(mis, filepath.Join(canonical(r.StagingPath), BlockStageFile))
	if dev == "" && staged != nil && r.StagingPath != "" {
		dev = boundDevice(mis, staged)
	}
	if dev == "" {
		return fmt.Errorf("no device given and none staged at %s: %w", r.StagingPath, ErrNotStaged)
	}
	if err := absPath("device", dev); err != nil {
		return err
	}
	if have := mountAt(mis, target); have != nil {
		if _, err := os.Stat(target); mountutils.IsCorruptedMnt(err) {
			if err := m.unmountAll(target); err != nil {
				return err
			}
		} else if got := boundDevice(mis, have); got != canonical(dev) {
			return fmt.Errorf("%s already holds %s, asked %s: %w", target, got, dev, ErrExists)
		} else if isReadOnly(have.MountOptions) != r.ReadOnly {
			return fmt.Errorf("%s is published with read-only=%t, asked %t: %w", target, !r.ReadOnly, r.ReadOnly, ErrExists)
		} else {
			return nil
		}
	}
	if err := bindDevice(m.mounter, dev, target, r.ReadOnly); err != nil {
		return err
	}
	m.log.Info("published block", "volume", r.VolumeID, "device", dev, "target", target, "readOnly", r.ReadOnly)
	return nil
}

// Unpublish unmounts targetPath (stale mounts included) and removes it. A
// missing target is success.
func (m *Manager) Unpublish(ctx context.Context, targetPath string) error {
	if err := absPath("target path", targetPath); err != nil {
		return err
	}
	target := canonical(targetPath)
	if share, err := m.isShareMount(target); err != nil {
		return err
	} else if share {
		if err := m.unmountShare(ctx, target); err != nil {
			return err
		}
	}
	if err := m.unmountAll(target); err != nil {
		return err
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", target, err)
	}
	m.log.Info("unpublished", "target", target)
	return nil
}

// Expand grows the filesystem on device (mounted at stagingPath) to the
// device's size; a device without a filesystem (block volume) needs nothing.
func (m *Manager) Expand(ctx context.Context, device, stagingPath string) error {
	if err := absPath("device", device); err != nil {
		return err
	}
	if _, err := mountutils.NewResizeFs(m.exec.Bind(ctx)).Resize(device, stagingPath); err != nil {
		// resize2fs's words for EPERM from EXT4_IOC_RESIZE_FS (no
		// CAP_SYS_RESOURCE); mount-utils keeps only the output.
		if strings.Contains(err.Error(), "Permission denied to resize filesystem") {
			return fmt.Errorf("resize filesystem on %s: %w: %v", device, ErrGrowsAtStage, err)
		}
		return fmt.Errorf("resize filesystem on %s: %w", device, err)
	}
	return nil
}

// Stats reports usage of the filesystem mounted at path, or the size of the
// device bound at path. Not mounted is ErrNotFound. An NFS mount is asked
// as shareStats asks it.
func (m *Manager) Stats(ctx context.Context, path string) (Stats, error) {
	if err := absPath("path", path); err != nil {
		return Stats{}, err
	}
	mis, err := m.mountInfo()
	if err != nil {
		return Stats{}, err
	}
	// An NFS mount is found by the path as given: resolving it would stat
	// the mount, which blocks while its server is away.
	if mi := mountAt(mis, filepath.Clean(path)); mi != nil && strings.HasPrefix(mi.FsType, "nfs") {
		return m.shareStats(ctx, mi.MountPoint)
	}
	p := canonical(path)
	if mountAt(mis, p) == nil {
		return Stats{}, fmt.Errorf("nothing mounted at %s: %w", p, ErrNotFound)
	}
	fi, err := os.Stat(p)
	if err != nil {
		return Stats{}, fmt.Errorf("stat %s: %w", p, err)
	}
	if fi.Mode()&os.ModeDevice != 0 {
		size, err := DeviceSize(p)
		return Stats{TotalBytes: size, Block: true}, err
	}
	return statfs(p)
}

// statfs is the usage of the filesystem at p.
func statfs(p string) (Stats, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return Stats{}, fmt.Errorf("statfs %s: %w", p, err)
	}
	bs := st.Bsize
	return Stats{
		TotalBytes:     int64(st.Blocks) * bs,
		UsedBytes:      int64(st.Blocks-st.Bfree) * bs,
		AvailableBytes: int64(st.Bavail) * bs,
		TotalInodes:    int64(st.Files),
		UsedInodes:     int64(st.Files - st.Ffree),
		FreeInodes:     int64(st.Ffree),
	}, nil
}

// DeviceSize is the size of the block device dev: its end, which needs no
// I/O (a read of a device whose server died would hang).
func DeviceSize(dev string) (int64, error) {
	f, err := os.Open(dev)
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", dev, err)
	}
	defer func() { _ = f.Close() }()
	size, err := f.Seek(0, 2)
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", dev, err)
	}
	return size, nil
}
