package mount

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// The Linux filesystem freeze ioctls (linux/fs.h: _IOWR('X', 119/120, int));
// golang.org/x/sys/unix does not name them.
const (
	ioctlFIFREEZE = 0xC0045877
	ioctlFITHAW   = 0xC0045878
)

// freezeTimeout bounds the freeze call itself: it flushes the filesystem
// first, which waits on the device.
const freezeTimeout = 30 * time.Second

// Freeze freezes the filesystem on dev (FIFREEZE on one of its mounts): its
// dirty data reaches the device and writers block until thaw, which the
// caller must call, however its copy ended. ErrNotFound: no filesystem of
// dev is mounted (a block staging, or nothing).
func (m *Manager) Freeze(ctx context.Context, dev string) (thaw func() error, err error) {
	target, err := m.mountOf(dev)
	if err != nil {
		return nil, err
	}
	return m.freezeAt(ctx, dev, target)
}

// mountOf returns a mount point of dev's filesystem in this namespace;
// ErrNotFound when there is none.
func (m *Manager) mountOf(dev string) (string, error) {
	major, minor, found, err := m.devNumber(dev)
	if err != nil {
		return "", err
	}
	if !found {
		return "", fmt.Errorf("device %s: %w", dev, ErrNotFound)
	}
	mis, err := m.mountInfo()
	if err != nil {
		return "", err
	}
	for _, mi := range mis {
		if mi.Major == major && mi.Minor == minor {
			return mi.MountPoint, nil
		}
	}
	return "", fmt.Errorf("no filesystem of %s is mounted: %w", dev, ErrNotFound)
}

// freezeAt freezes the filesystem mounted at target, of dev.
func (m *Manager) freezeAt(ctx context.Context, dev, target string) (thaw func() error, err error) {
	f, err := os.Open(target)
	if err != nil {
		return nil, fmt.Errorf("open %s to freeze it: %w", target, err)
	}
	ctx, cancel := context.WithTimeout(ctx, freezeTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- ioctl(f, ioctlFIFREEZE) }()
	select {
	case err := <-done:
		if err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("freeze %s: %w", target, err)
		}
	case <-ctx.Done():
		// The freeze may still complete: thaw it then, so nothing stays frozen.
		go func() {
			if <-done == nil {
				if err := ioctl(f, ioctlFITHAW); err != nil {
					m.log.Error(err, "thaw a freeze that completed after its timeout", "path", target)
				}
			}
			_ = f.Close()
		}()
		return nil, fmt.Errorf("freeze %s: %w", target, ctx.Err())
	}
	m.log.Info("froze filesystem", "device", dev, "path", target)
	return func() error {
		defer func() { _ = f.Close() }()
		if err := ioctl(f, ioctlFITHAW); err != nil {
			return fmt.Errorf("thaw %s: %w", target, err)
		}
		m.log.Info("thawed filesystem", "device", dev, "path", target)
		return nil
	}, nil
}

func ioctl(f *os.File, req uintptr) error {
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), req, 0); errno != 0 {
		return errno
	}
	return nil
}

// FreezeElsewhere freezes the filesystem of dev that is mounted only in
// another mount namespace (a share manager's pod), where Freeze finds no
// mount. A block device has one superblock however often it is mounted, so
// a mount of dev at scratch (made here, of fsType) is that same filesystem,
// and freezing it there freezes the other mount too. thaw also unmounts
// scratch. ErrNotFound: dev is mounted nowhere (it opens exclusively),
// so nothing writes through a filesystem.
func (m *Manager) FreezeElsewhere(ctx context.Context, dev, fsType, scratch string) (thaw func() error, err error) {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_EXCL, 0)
	if err == nil {
		_ = f.Close()
		return nil, fmt.Errorf("no filesystem of %s is mounted anywhere: %w", dev, ErrNotFound)
	}
	if !errors.Is(err, unix.EBUSY) {
		return nil, fmt.Errorf("open %s: %w", dev, err)
	}
	if err := os.MkdirAll(scratch, 0o700); err != nil {
		return nil, err
	}
	// The same read-write flag as the other mount, or the kernel refuses
	// to share the superblock (EBUSY).
	if err := m.mounter.Mount(dev, scratch, fsType, nil); err != nil {
		_ = os.Remove(scratch)
		return nil, fmt.Errorf("mount %s at %s to freeze it: %w", dev, scratch, err)
	}
	release := func() error {
		if err := m.mounter.Unmount(scratch); err != nil {
			return fmt.Errorf("unmount %s after the freeze: %w", scratch, err)
		}
		return os.Remove(scratch)
	}
	thawAt, err := m.freezeAt(ctx, dev, scratch)
	if err != nil {
		return nil, errors.Join(err, release())
	}
	return func() error { return errors.Join(thawAt(), release()) }, nil
}

// Thaw thaws the filesystem of dev mounted here (FITHAW on one of its
// mounts) and tells whether it was frozen: FITHAW of a filesystem that is
// not frozen fails with EINVAL, which is no error here. ErrNotFound: no
// filesystem of dev is mounted in this namespace.
func (m *Manager) Thaw(_ context.Context, dev string) (wasFrozen bool, err error) {
	target, err := m.mountOf(dev)
	if err != nil {
		return false, err
	}
	return m.thawAt(dev, target)
}

// ThawElsewhere is Thaw for a filesystem of dev mounted only in another
// mount namespace, which FreezeElsewhere froze through a mount at scratch
// that may be gone (it was in a dead agent's namespace): dev is mounted
// at scratch again, thawed there and unmounted. Nothing mounted anywhere
// is nothing frozen.
func (m *Manager) ThawElsewhere(_ context.Context, dev, fsType, scratch string) (wasFrozen bool, err error) {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_EXCL, 0)
	if err == nil {
		_ = f.Close()
		return false, m.dropScratch(scratch)
	}
	if errors.Is(err, os.ErrNotExist) {
		return false, m.dropScratch(scratch)
	}
	if !errors.Is(err, unix.EBUSY) {
		return false, fmt.Errorf("open %s: %w", dev, err)
	}
	if err := os.MkdirAll(scratch, 0o700); err != nil {
		return false, err
	}
	// Mounting a frozen filesystem's device again works: it shares the
	// frozen superblock, and nothing in the mount waits for the thaw.
	if err := m.mounter.Mount(dev, scratch, fsType, nil); err != nil {
		return false, fmt.Errorf("mount %s at %s to thaw it: %w", dev, scratch, err)
	}
	wasFrozen, err = m.thawAt(dev, scratch)
	return wasFrozen, errors.Join(err, m.dropScratch(scratch))
}

// dropScratch unmounts everything at scratch (a dead agent's mount may be
// there under the one just made) and removes it.
func (m *Manager) dropScratch(scratch string) error {
	if err := m.unmountAll(scratch); err != nil {
		return err
	}
	if err := os.Remove(scratch); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// thawAt thaws the filesystem mounted at target, of dev.
func (m *Manager) thawAt(dev, target string) (wasFrozen bool, err error) {
	f, err := os.Open(target)
	if err != nil {
		return false, fmt.Errorf("open %s to thaw it: %w", target, err)
	}
	defer func() { _ = f.Close() }()
	switch err := ioctl(f, ioctlFITHAW); {
	case errors.Is(err, unix.EINVAL):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("thaw %s: %w", target, err)
	}
	m.log.Info("thawed filesystem", "device", dev, "path", target)
	return true, nil
}
