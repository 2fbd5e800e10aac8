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
	major, minor, found, err := m.devNumber(dev)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("device %s: %w", dev, ErrNotFound)
	}
	mis, err := m.mountInfo()
	if err != nil {
		return nil, err
	}
	var target string
	for _, mi := range mis {
		if mi.Major == major && mi.Minor == minor {
			target = mi.MountPoint
			break
		}
	}
	if target == "" {
		return nil, fmt.Errorf("no filesystem of %s is mounted: %w", dev, ErrNotFound)
	}
	return m.freezeAt(ctx, dev, target)
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
