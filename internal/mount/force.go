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
	"k8s.io/utils/exec"
)

// ForceUnmountDevice removes every mount of dev on this node: filesystem
// mounts (staging and pod bind mounts) and bind mounts of the device node
// (block staging and block publishes), whether or not processes use them.
// A busy mount is detached lazily (MNT_DETACH): it vanishes from the mount
// table now and is released when its last user goes. This is for cleanup of
// what berth must no longer hold (a deleted cluster, a fenced node), never
// for the normal unstage path. It returns the paths it unmounted.
func (m *Manager) ForceUnmountDevice(ctx context.Context, dev string) ([]string, error) {
	major, minor, found, err := m.devNumber(dev)
	if err != nil || !found {
		return nil, err
	}
	mis, err := m.mountInfo()
	if err != nil {
		return nil, err
	}
	var targets []string
	for i := range mis {
		mi := &mis[i]
		if (mi.Major == major && mi.Minor == minor) || isBindOf(mis, mi, dev) {
			targets = append(targets, mi.MountPoint)
		}
	}
	var done []string
	// Later lines sit on top of earlier ones: unmount from the end.
	for i := len(targets) - 1; i >= 0; i-- {
		if err := ctx.Err(); err != nil {
			return done, err
		}
		t := targets[i]
		if err := m.mounter.Unmount(t); err != nil {
			if lerr := m.lazyUnmount(t); lerr != nil && !errors.Is(lerr, unix.EINVAL) {
				return done, fmt.Errorf("force unmount %s: %w (lazy: %w)", t, err, lerr)
			}
		}
		done = append(done, t)
		m.log.Info("force unmounted", "path", t, "device", dev)
	}
	return done, nil
}

// statDevNumber returns the device number of the node dev; found is false
// when there is no such node.
func statDevNumber(dev string) (major, minor int, found bool, err error) {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, 0, false, nil
		}
		return 0, 0, false, fmt.Errorf("stat %s: %w", dev, err)
	}
	return int(unix.Major(st.Rdev)), int(unix.Minor(st.Rdev)), true, nil
}

// NewMounter returns the node's mounter: mount-utils' own, plus lazy
// unmount (LazyUnmounter) for force cleanup. Its mount and umount commands
// run with a timeout (NewManager's Tools; DefaultTimeouts until then):
// mount-utils runs them with none.
func NewMounter() mountutils.Interface {
	return kernelMounter{Interface: mountutils.New(""), tools: NewTools(exec.New(), Timeouts{})}
}

type kernelMounter struct {
	mountutils.Interface
	tools *Tools
}

// Mount implements mountutils.Interface.
func (k kernelMounter) Mount(source, target, fstype string, options []string) error {
	return k.MountSensitive(source, target, fstype, options, nil)
}

// MountSensitive implements mountutils.Interface as mount-utils does,
// through mount(8), bounded by the tools' timeout. A bind mount with
// options is a bind, then a remount with them (older mount(8) ignores
// options on a bind).
func (k kernelMounter) MountSensitive(source, target, fstype string, options, sensitive []string) error {
	bind, bindOpts, remountOpts, remountSensitive := mountutils.MakeBindOptsSensitive(options, sensitive)
	if !bind {
		return k.mount(source, target, fstype, options, sensitive)
	}
	if err := k.mount(source, target, fstype, bindOpts, nil); err != nil {
		return err
	}
	if len(remountOpts) == 0 && len(remountSensitive) == 0 {
		return nil
	}
	return k.mount(source, target, fstype, remountOpts, remountSensitive)
}

func (k kernelMounter) mount(source, target, fstype string, options, sensitive []string) error {
	args, logged := mountutils.MakeMountArgsSensitive(source, target, fstype, options, sensitive)
	if out, err := k.tools.Command("mount", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("mount %s: %w: %s", logged, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Unmount implements mountutils.Interface through umount(8), bounded by
// the tools' timeout; nothing mounted there is success, as with mount-utils.
func (k kernelMounter) Unmount(target string) error {
	out, err := k.tools.Command("umount", target).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "not mounted") {
		return fmt.Errorf("umount %s: %w: %s", target, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// UnmountForce implements ForceUnmounter through umount -f, bounded by the
// tools' timeout; nothing mounted there is success.
func (k kernelMounter) UnmountForce(target string) error {
	out, err := k.tools.Command("umount", "-f", target).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "not mounted") {
		return fmt.Errorf("umount -f %s: %w: %s", target, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// UnmountLazy implements LazyUnmounter with umount2(MNT_DETACH), never
// following a symlink at target (a link planted there must not redirect a
// forced cleanup to another mount).
func (kernelMounter) UnmountLazy(target string) error {
	if err := unix.Unmount(target, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
		return fmt.Errorf("lazy unmount %s: %w", target, err)
	}
	return nil
}

// isBindOf tells whether mi is a bind mount of the device node dev itself
// (a block volume's staging or publish target).
func isBindOf(mis []mountutils.MountInfo, mi *mountutils.MountInfo, dev string) bool {
	return mi.FsType == "devtmpfs" && mi.Root != "/" && boundDevice(mis, mi) == filepath.Clean(dev)
}

// ForceUnpublish unmounts a pod's target path even while it is busy (lazy
// detach), then removes it as Unpublish does.
func (m *Manager) ForceUnpublish(ctx context.Context, target string) error {
	if err := m.Unpublish(ctx, target); err == nil {
		return nil
	}
	for range 8 {
		if err := m.lazyUnmount(target); err != nil {
			break // EINVAL: nothing mounted any more
		}
		m.log.Info("force unmounted", "path", target)
	}
	return m.Unpublish(ctx, target)
}

// IsMounted tells whether anything is mounted at path.
func (m *Manager) IsMounted(_ context.Context, path string) (bool, error) {
	mis, err := m.mountInfo()
	if err != nil {
		return false, err
	}
	return mountAt(mis, canonical(path)) != nil, nil
}
