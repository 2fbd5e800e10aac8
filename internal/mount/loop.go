package mount

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"k8s.io/utils/exec"

	"github.com/berth-io/berth/internal/volerr"
)

// Loop manages loop devices over image files.
type Loop interface {
	// Attach returns the loop device over backingFile, making one (with
	// direct I/O) only when none exists, so a retry after a crash never
	// makes a second.
	Attach(ctx context.Context, backingFile string, readOnly bool) (dev string, err error)
	Find(ctx context.Context, backingFile string) (dev string, found bool, err error)
	// Detach frees dev; a device already free is not an error. A device
	// still mounted is freed by the kernel once unmounted (autoclear).
	Detach(ctx context.Context, dev string) error
	// Refresh makes dev see its backing file's new size.
	Refresh(ctx context.Context, dev string) error
	// BackingName is dev's backing file as sysfs names it (found false
	// for a free device), read without any I/O on the file: for a device
	// whose file cannot be reached any more.
	BackingName(dev string) (name string, found bool, err error)
}

// losetup drives util-linux losetup to attach and detach, which does the
// free-device search and its races with other users of /dev/loop-control
// for us; finding reads the kernel directly (finder), since losetup's
// --associated stats the backing file of every loop device on the node.
type losetup struct {
	exec   exec.Interface
	finder finder
}

// NewLoop returns a Loop that runs losetup through e (Tools, or a plain
// executor that gets DefaultTimeouts) and reads the host's sysfs.
func NewLoop(e exec.Interface) Loop { return newLoop(e, sysLoop{sysfs: "/sys"}) }

func newLoop(e exec.Interface, k loopKernel) *losetup {
	t := toolsOf(e)
	return &losetup{exec: t, finder: finder{kernel: k, timeout: t.timeouts.Loop, calls: &inflight{stalled: errStalled}}}
}

func (l *losetup) run(ctx context.Context, args ...string) (string, error) {
	out, err := l.exec.CommandContext(ctx, "losetup", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("losetup %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// find matches by the file's device and inode, so that a file of the same
// path in another mount namespace never matches.
func (l *losetup) find(ctx context.Context, backingFile string) (dev string, readOnly, found bool, err error) {
	if backingFile == "" {
		return "", false, false, fmt.Errorf("empty backing file: %w", volerr.ErrInvalid)
	}
	f, ok, err := l.finder.find(ctx, backingFile)
	return f.dev, f.readOnly, ok, err
}

// parseShown reads the device `losetup --find --show` printed last.
func parseShown(out string) (dev string) {
	// --show prints the device last; warnings (e.g. no direct I/O on this
	// filesystem) come before it.
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line = strings.TrimSpace(line); isDevPath(line) {
			dev = line
		}
	}
	return dev
}

// isDevPath accepts only a loop device's name, /dev/loopN: nothing else is a
// device that losetup prints or sysfs lists. (A looser "clean path in one field" let
// Unicode spaces such as U+0085 through: found by FuzzLosetupOutput.)
func isDevPath(s string) bool {
	n, ok := strings.CutPrefix(s, "/dev/loop")
	if !ok || n == "" || len(n) > 10 {
		return false
	}
	for _, c := range n {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func (l *losetup) Find(ctx context.Context, backingFile string) (string, bool, error) {
	dev, _, found, err := l.find(ctx, backingFile)
	return dev, found, err
}

func (l *losetup) Attach(ctx context.Context, backingFile string, readOnly bool) (string, error) {
	dev, ro, found, err := l.find(ctx, backingFile)
	if err != nil {
		return "", err
	}
	if found {
		if ro != readOnly {
			return "", fmt.Errorf("%s is attached as %s with read-only=%t, asked %t: %w", backingFile, dev, ro, readOnly, ErrExists)
		}
		return dev, nil
	}
	args := []string{"--find", "--show", "--direct-io=on"}
	if readOnly {
		args = append(args, "--read-only")
	}
	out, err := l.run(ctx, append(args, backingFile)...)
	if err != nil {
		return "", err
	}
	if dev = parseShown(out); dev == "" {
		return "", fmt.Errorf("losetup printed no device for %s: %q", backingFile, out)
	}
	return dev, nil
}

func (l *losetup) Detach(ctx context.Context, dev string) error {
	if dev == "" {
		return fmt.Errorf("empty device: %w", volerr.ErrInvalid)
	}
	out, err := l.run(ctx, "--detach", dev)
	// losetup reports a free device as ENXIO and a missing node as ENOENT;
	// both mean there is nothing to detach.
	if err != nil && (strings.Contains(out, "No such device or address") || strings.Contains(out, "No such file or directory")) {
		return nil
	}
	return err
}

func (l *losetup) BackingName(dev string) (string, bool, error) {
	bound, err := l.finder.kernel.Bound()
	if err != nil {
		return "", false, err
	}
	for _, b := range bound {
		if b.Dev == dev {
			return b.Backing, true, nil
		}
	}
	return "", false, nil
}

func (l *losetup) Refresh(ctx context.Context, dev string) error {
	if dev == "" {
		return fmt.Errorf("empty device: %w", volerr.ErrInvalid)
	}
	if err := syncBackingSize(dev); err != nil {
		return err
	}
	_, err := l.run(ctx, "--set-capacity", dev)
	return err
}

// syncBackingSize makes the kernel fetch the size of dev's backing file
// anew. The loop driver takes the size the kernel has cached for the file;
// for a file on FUSE (userspace volumes) that cache may predate the
// expansion, so the new size would be missed. A forced statx asks the file
// system; on a local file system it is a plain stat.
func syncBackingSize(dev string) error {
	sysfs := filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file")
	b, err := os.ReadFile(sysfs)
	if err != nil {
		return fmt.Errorf("backing file of %s: %w", dev, err)
	}
	backing := strings.TrimSuffix(string(b), "\n")
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, backing, unix.AT_STATX_FORCE_SYNC, unix.STATX_SIZE, &st); err != nil {
		return fmt.Errorf("stat backing file %s of %s: %w", backing, dev, err)
	}
	return nil
}
