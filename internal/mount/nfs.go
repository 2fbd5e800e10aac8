package mount

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// NFSRequest mounts a share's NFS export (Source, host:/export) at a pod's
// TargetPath.
type NFSRequest struct {
	VolumeID, Source, TargetPath string
	ReadOnly                     bool
	MountFlags                   []string
}

// nfsOptions let a client ride a share manager's failover: hard (I/O waits,
// never fails, while the server is away), NFSv4.1 (sessions, state
// reclaimed in the new server's grace period), a 5 s retransmit timeout
// with few retries so that a new server behind the same Service is found
// quickly, and noresvport so that a reconnect need not wait for a
// privileged source port. nosuid and nodev: whoever writes the share (any
// pod with a claim on it, on any node it serves) must not plant a setuid
// binary or a device node that another pod then uses.
func nfsOptions() []string {
	return []string{"hard", "nfsvers=4.1", "proto=tcp", "timeo=50", "retrans=3", "noresvport", "nosuid", "nodev"}
}

// MountNFS mounts r.Source at r.TargetPath with the kernel NFS client.
// Mounted there already (a retry) is success; another mount there is
// ErrExists.
func (m *Manager) MountNFS(_ context.Context, r NFSRequest) error {
	if err := absPath("target path", r.TargetPath); err != nil {
		return err
	}
	target := canonical(r.TargetPath)
	mps, err := m.mounter.List()
	if err != nil {
		return fmt.Errorf("list mounts: %w", err)
	}
	for _, mp := range mps {
		if mp.Path != target {
			continue
		}
		if mp.Device == r.Source && strings.HasPrefix(mp.Type, "nfs") {
			return nil
		}
		return fmt.Errorf("%s already holds %s (%s): %w", target, mp.Device, mp.Type, ErrExists)
	}
	if err := mkdirTarget(target); err != nil {
		return err
	}
	opts := append(nfsOptions(), r.MountFlags...)
	if r.ReadOnly {
		opts = append(opts, "ro")
	}
	if err := m.mounter.Mount(r.Source, target, "nfs4", opts); err != nil {
		return fmt.Errorf("mount %s at %s: %w", r.Source, target, err)
	}
	m.log.Info("mounted share", "volume", r.VolumeID, "source", r.Source, "target", target, "options", opts)
	return nil
}

// NFSCondition tells the health of a share's NFS mount at path; share is
// false when path holds no NFS mount, which the caller then checks as a
// staged volume. The server is not asked: on a hard mount that would block
// while a failover runs, which is a stall, not a fault.
func (m *Manager) NFSCondition(_ context.Context, path string) (abnormal bool, msg string, share bool) {
	mis, err := m.mountInfo()
	if err != nil {
		return false, "", false
	}
	mi := mountAt(mis, path)
	if mi == nil || !strings.HasPrefix(mi.FsType, "nfs") {
		return false, "", false
	}
	if isReadOnly(mi.SuperOptions) && !isReadOnly(mi.MountOptions) {
		return true, fmt.Sprintf("share %s at %s is read-only", mi.Source, path), true
	}
	return false, "", true
}

// errShareStalled: a share's server did not answer a probe or an unmount
// in time; the call goes on.
var errShareStalled = errors.New("the NFS server did not answer")

// ErrNotShareMount: the path holds no NFS mount (the share manager's own
// block device, or a pod whose mount is gone already).
var ErrNotShareMount = errors.New("no NFS mount there")

// ProbeShare checks that the share mounted at path answers: a stat of the
// mount's root goes to the server. On a hard mount the stat waits while
// the server is away, and nothing cancels it: ProbeShare returns when ctx
// ends, and a later probe of path waits for that stat rather than start
// another. ErrNotShareMount when path holds no NFS mount.
func (m *Manager) ProbeShare(ctx context.Context, path string) error {
	mis, err := m.mountInfo()
	if err != nil {
		return fmt.Errorf("read mounts: %w", err)
	}
	if mi := mountAt(mis, path); mi == nil || !strings.HasPrefix(mi.FsType, "nfs") {
		return fmt.Errorf("%s: %w", path, ErrNotShareMount)
	}
	err = m.shares.doErr(ctx, "stat of "+path, func() error {
		_, err := m.stat(path)
		return err
	})
	if err != nil {
		return fmt.Errorf("share mounted at %s: %w", path, err)
	}
	return nil
}

// ShareStats is the usage of volume's share (its export is /<volume>)
// mounted at path; ErrNotShareMount when path holds no NFS mount of it.
func (m *Manager) ShareStats(ctx context.Context, path, volume string) (Stats, error) {
	if err := absPath("path", path); err != nil {
		return Stats{}, err
	}
	mis, err := m.mountInfo()
	if err != nil {
		return Stats{}, fmt.Errorf("read mounts: %w", err)
	}
	mi := mountAt(mis, filepath.Clean(path))
	if mi == nil || !strings.HasPrefix(mi.FsType, "nfs") || !strings.HasSuffix(mi.Source, ":/"+volume) {
		return Stats{}, fmt.Errorf("%s: no share of %s: %w", path, volume, ErrNotShareMount)
	}
	return m.shareStats(ctx, mi.MountPoint)
}

// shareStats reads the usage of the NFS mount at p once at a time and no
// longer than ctx: on a hard mount whose server is away the stat and the
// statfs block in the kernel, and a later call waits for the one in flight
// rather than start another.
func (m *Manager) shareStats(ctx context.Context, p string) (Stats, error) {
	var st Stats
	err := m.shares.doErr(ctx, "statfs of "+p, func() error {
		if _, err := m.stat(p); err != nil {
			return fmt.Errorf("stat %s: %w", p, err)
		}
		var err error
		st, err = statfs(p)
		return err
	})
	return st, err
}

// isShareMount tells whether target holds an NFS mount.
func (m *Manager) isShareMount(target string) (bool, error) {
	mis, err := m.mountInfo()
	if err != nil {
		return false, fmt.Errorf("read mounts: %w", err)
	}
	mi := mountAt(mis, target)
	return mi != nil && strings.HasPrefix(mi.FsType, "nfs"), nil
}

// unmountShare takes a share's NFS mount away from target, once per target
// at a time (later callers wait for the one in flight, until ctx ends).
//
// The kernel gives every mount of one export with the same options one
// superblock, and `umount -f` aborts the requests in flight of the whole
// superblock: another pod's mount of the volume on this node (a reader
// that came while a writer left) would have its I/O fail with EIO. So
// while another mount shares the superblock, target is only detached
// (MNT_DETACH): the superblock lives on with the other mount, and a detach
// neither waits for the server nor aborts anything. The last mount of a
// superblock is forced: a plain umount(8) of a hard mount whose server is
// gone blocks in the kernel and stays blocked after it is killed, one more
// with every kubelet retry, while `umount -f` aborts the RPCs in flight;
// when even it fails, the mount is detached too.
func (m *Manager) unmountShare(ctx context.Context, target string) error {
	return m.shares.doErr(ctx, "unmount of "+target, func() error {
		others, err := m.sameSuperblock(target)
		if err != nil {
			return err
		}
		if len(others) > 0 {
			if err := m.lazyUnmount(target); err != nil {
				return fmt.Errorf("detach %s from the share mounted at %v too: %w", target, others, err)
			}
			return nil
		}
		err = m.forceUnmount(target)
		if err == nil {
			return nil
		}
		m.log.Info("forced unmount of a share failed: detaching it", "target", target, "err", err.Error())
		if lerr := m.lazyUnmount(target); lerr != nil {
			return fmt.Errorf("%w; detach: %w", err, lerr)
		}
		return nil
	})
}

// sameSuperblock lists the other mounts of the superblock mounted at
// target (same device number): other pods' mounts of the same share.
func (m *Manager) sameSuperblock(target string) ([]string, error) {
	mis, err := m.mountInfo()
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	mi := mountAt(mis, target)
	if mi == nil {
		return nil, nil
	}
	return refs(mis, mi, false), nil
}
