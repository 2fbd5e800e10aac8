package mount

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
	mountutils "k8s.io/mount-utils"

	"github.com/berth-io/berth/internal/volerr"
)

// BlockStageFile is where a block volume's device node is bound inside the
// staging dir. The bind is the only record of the device, and it is kernel
// state: nothing is left behind if the node reboots.
const BlockStageFile = "device"

var fsTypes = map[string]bool{"ext4": true, "xfs": true, "ext3": true}

func absPath(name, p string) error {
	if p == "" || !filepath.IsAbs(p) {
		return fmt.Errorf("%s %q must be an absolute path: %w", name, p, volerr.ErrInvalid)
	}
	return nil
}

// Stage formats Device when blank (as r.Format allows, see allowFormat) and
// mounts it at StagingPath; for Block it
// binds the device node to StagingPath/device. Already staged from the same
// device is success; from another is ErrExists.
func (m *Manager) Stage(ctx context.Context, r StageRequest) error {
	if err := absPath("staging path", r.StagingPath); err != nil {
		return err
	}
	if err := absPath("device", r.Device); err != nil {
		return err
	}
	if r.Block {
		return m.stageBlock(r)
	}
	if r.FSType == "" {
		r.FSType = "ext4"
	}
	if !fsTypes[r.FSType] {
		return fmt.Errorf("fs type %q: %w", r.FSType, volerr.ErrInvalid)
	}
	staging := canonical(r.StagingPath)
	mis, err := m.mountInfo()
	if err != nil {
		return err
	}
	if mountAt(mis, filepath.Join(staging, BlockStageFile)) != nil {
		return fmt.Errorf("%s is staged as a block volume: %w", staging, ErrExists)
	}
	if mi := mountAt(mis, staging); mi != nil {
		if _, err := os.Stat(staging); mountutils.IsCorruptedMnt(err) {
			m.log.Info("unmounting stale staging mount", "path", staging, "err", err.Error())
			if err := m.mounter.Unmount(staging); err != nil {
				return fmt.Errorf("unmount stale %s: %w", staging, err)
			}
		} else if mi.Source == r.Device || sameDevice(r.Device, mi.Major, mi.Minor) {
			return nil
		} else {
			return fmt.Errorf("%s already holds %s, asked %s: %w", staging, mi.Source, r.Device, ErrExists)
		}
	}
	if err := mkdirTarget(staging); err != nil {
		return err
	}
	opts := append([]string{}, r.MountFlags...)
	if r.ReadOnly {
		opts = append(opts, "ro")
	}
	// A clone or restore is a copy of its source, XFS UUID included; XFS
	// refuses a second mount of a UUID on one node unless told nouuid.
	if r.FSType == "xfs" && !slices.Contains(opts, "nouuid") {
		opts = append(opts, "nouuid")
	}
	found, err := m.allowFormat(ctx, r)
	if err != nil {
		return fmt.Errorf("stage %s: %w", r.Device, err)
	}
	defer m.gate.close(r.Device)
	// Only the volume's own, existing filesystem of the recorded type grows;
	// a fresh one already spans the device.
	grow := found != "" && found == r.FSType && !r.ReadOnly
	if grow {
		if err := m.growUnmounted(ctx, r.Device, found); err != nil {
			return fmt.Errorf("stage %s: %w", r.Device, err)
		}
	}
	if err := m.formatter(ctx).FormatAndMountSensitiveWithFormatOptions(r.Device, staging, r.FSType, opts, nil, noDiscard(r.FSType)); err != nil {
		return fmt.Errorf("format and mount %s at %s: %w", r.Device, staging, err)
	}
	if grow {
		m.growMounted(ctx, r.Device, staging, found)
	}
	m.log.Info("staged", "volume", r.VolumeID, "device", r.Device, "path", staging, "fsType", r.FSType)
	return nil // done: a deadline passing now must not turn success into failure
}

func (m *Manager) stageBlock(r StageRequest) error {
	staging := canonical(r.StagingPath)
	mis, err := m.mountInfo()
	if err != nil {
		return err
	}
	if mountAt(mis, staging) != nil {
		return fmt.Errorf("%s is staged as a filesystem: %w", staging, ErrExists)
	}
	file := filepath.Join(staging, BlockStageFile)
	if mi := mountAt(mis, file); mi != nil {
		if have := boundDevice(mis, mi); have != canonical(r.Device) {
			return fmt.Errorf("%s already holds %s, asked %s: %w", staging, have, r.Device, ErrExists)
		}
		return nil
	}
	if err := mkdirTarget(staging); err != nil {
		return err
	}
	if err := bindDevice(m.mounter, r.Device, file, r.ReadOnly); err != nil {
		return err
	}
	m.log.Info("staged block", "volume", r.VolumeID, "device", r.Device, "path", staging)
	return nil
}

// mkdirTarget makes dir, refusing a non-directory in its place.
func mkdirTarget(dir string) error {
	if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
		return fmt.Errorf("%s exists and is not a directory: %w", dir, volerr.ErrInvalid)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("mkdir %s: %w", dir, err)
	}
	return nil
}

// bindDevice binds a device node onto file, creating file; on failure it
// removes only a file it created.
func bindDevice(mounter mountutils.Interface, dev, file string, readOnly bool) error {
	if fi, err := os.Stat(file); err == nil && fi.IsDir() {
		return fmt.Errorf("%s exists and is a directory: %w", file, volerr.ErrInvalid)
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o750); err != nil {
		return fmt.Errorf("mkdir %s: %w", filepath.Dir(file), err)
	}
	f, err := os.OpenFile(file, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o640)
	created := err == nil
	if err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create %s: %w", file, err)
	}
	if created {
		_ = f.Close()
	}
	opts := []string{"bind"}
	if readOnly {
		opts = append(opts, "ro")
	}
	if err := mounter.Mount(dev, file, "", opts); err != nil {
		if created {
			_ = os.Remove(file)
		}
		return fmt.Errorf("bind %s to %s: %w", dev, file, err)
	}
	return nil
}

// StagedDevice returns the device staged at stagingPath and whether it is a
// block (not filesystem) staging; "" when nothing is staged.
func (m *Manager) StagedDevice(_ context.Context, stagingPath string) (device string, block bool, err error) {
	mis, err := m.mountInfo()
	if err != nil {
		return "", false, err
	}
	staging := canonical(stagingPath)
	if mi := mountAt(mis, filepath.Join(staging, BlockStageFile)); mi != nil {
		return boundDevice(mis, mi), true, nil
	}
	if mi := mountAt(mis, staging); mi != nil {
		return fsDevice(mi), false, nil
	}
	return "", false, nil
}

// Unstage unmounts the staging path and removes it, returning the device
// that was staged so the caller can detach it. It refuses with ErrInUse
// while another mount of the device (a pod's bind mount) remains, and with
// a *HeldOpenError (also ErrInUse) while a process holds the device open.
// Nothing staged is ("", nil).
func (m *Manager) Unstage(ctx context.Context, stagingPath string) (string, error) {
	if err := absPath("staging path", stagingPath); err != nil {
		return "", err
	}
	staging := canonical(stagingPath)
	mis, err := m.mountInfo()
	if err != nil {
		return "", err
	}
	target, block := filepath.Join(staging, BlockStageFile), true
	mi := mountAt(mis, target)
	if mi == nil {
		target, block = staging, false
		mi = mountAt(mis, staging)
	}
	if mi == nil {
		return "", removeStaging(staging)
	}
	device := fsDevice(mi)
	if block {
		device = boundDevice(mis, mi)
	}
	if r := refs(mis, mi, block); len(r) > 0 {
		return "", fmt.Errorf("%s (%s) is still mounted at %v: %w", staging, device, r, ErrInUse)
	}
	pids, err := m.openers(device)
	if err != nil {
		return "", fmt.Errorf("check users of %s: %w", device, err)
	}
	if len(pids) > 0 {
		held := &HeldOpenError{Device: device}
		for _, pid := range pids {
			held.Holders = append(held.Holders, describeHolder(m.procRoot, pid))
		}
		return "", held
	}
	if err := m.unmountAll(target); err != nil {
		return "", err
	}
	if err := removeStaging(staging); err != nil {
		return "", err
	}
	m.log.Info("unstaged", "path", staging, "device", device, "block", block)
	return device, nil
}

// removeStaging removes the (unmounted) staging dir and the block bind file.
func removeStaging(staging string) error {
	for _, p := range []string{filepath.Join(staging, BlockStageFile), staging} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOTDIR) {
			return fmt.Errorf("remove %s: %w", p, err)
		}
	}
	return nil
}

// unmountAll unmounts path until nothing is mounted there: a crashed retry
// may have stacked two mounts. Stale mounts need no stat, so they go too.
func (m *Manager) unmountAll(path string) error {
	for range 8 {
		mis, err := m.mountInfo()
		if err != nil {
			return err
		}
		if mountAt(mis, path) == nil {
			return nil
		}
		if err := m.mounter.Unmount(path); err != nil {
			return fmt.Errorf("unmount %s: %w", path, err)
		}
	}
	return fmt.Errorf("%s is still mounted after repeated unmounts: %w", path, ErrInUse)
}

// StagingOf finds the staging mount, directly below stagingRoot, of the
// filesystem that target shows (a pod's bind mount of it): the answer to
// "what was this staged from" when no record says. "" when target is not
// mounted or shows nothing staged there.
func (m *Manager) StagingOf(_ context.Context, target, stagingRoot string) (string, error) {
	mis, err := m.mountInfo()
	if err != nil {
		return "", err
	}
	mi := mountAt(mis, canonical(target))
	if mi == nil {
		return "", nil
	}
	root := canonical(stagingRoot)
	for i := range mis {
		o := &mis[i]
		if o.Major == mi.Major && o.Minor == mi.Minor && o.Root == mi.Root && filepath.Dir(o.MountPoint) == root {
			return o.MountPoint, nil
		}
	}
	return "", nil
}

// noDiscard are mkfs options that skip discarding the device first: on a
// loop device discard punches holes in the image, undoing the reservation
// of a local volume's space, and on a large RBD image it takes minutes
// for nothing (a new image reads zeros anyway).
func noDiscard(fsType string) []string {
	switch fsType {
	case "ext4", "ext3":
		return []string{"-E", "nodiscard"}
	case "xfs":
		return []string{"-K"}
	}
	return nil
}
