package keeper

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Kernel is the keeper's side effects on the kernel, an interface so that the
// request handling can be unit-tested without mounting.
type Kernel interface {
	// OpenFUSE opens /dev/fuse.
	OpenFUSE() (int, error)
	// MountFUSE mounts a FUSE file system at mountpoint on connection fd.
	MountFUSE(fd int, source, mountpoint string) error
	// Unmount removes the mount at mountpoint, lazily if it is busy.
	Unmount(mountpoint string) error
	// Mounted says whether something is mounted at mountpoint.
	Mounted(mountpoint string) (bool, error)
	// CloseFD closes fd.
	CloseFD(fd int) error
	// WatchProcess follows process pid until Release.
	WatchProcess(pid int32) (Process, error)
	// CheckFUSE fails unless fd, passed in a hand-over, is a /dev/fuse
	// connection.
	CheckFUSE(fd int) error
	// AdoptProcess follows the process of fd, a handle (pidfd) the
	// previous keeper passed, until Release. pid is its pid as this
	// process sees it, 0 when it has exited or is out of sight.
	AdoptProcess(fd int) (p Process, pid int32, err error)
}

// Process is a watched process.
type Process interface {
	Alive() bool
	// Stop sends SIGTERM, waits up to wait, then SIGKILL, and waits up to
	// wait again; nil once the process is gone.
	Stop(wait time.Duration) error
	Release()
	// FD is the handle a hand-over passes on (-1: none to pass).
	FD() int
}

// HostKernel is the real Kernel.
type HostKernel struct{}

var _ Kernel = HostKernel{}

// OpenFUSE opens a new FUSE connection. Never mount anything on /dev/fuse
// itself: that breaks every FUSE user of the machine.
func (HostKernel) OpenFUSE() (int, error) {
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open /dev/fuse: %w", err)
	}
	return fd, nil
}

// MountFUSE creates mountpoint (0700) if needed and mounts.
func (HostKernel) MountFUSE(fd int, source, mountpoint string) error {
	if err := os.MkdirAll(mountpoint, 0o700); err != nil {
		return fmt.Errorf("create mountpoint: %w", err)
	}
	// allow_other lets the loop device (opened by whoever attaches it) reach
	// the image; default_permissions makes the kernel check the image's mode
	// bits against the caller, so that allow_other opens it to root alone.
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions", fd)
	if err := unix.Mount(source, mountpoint, "fuse.berth", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("mount fuse at %s: %w", mountpoint, err)
	}
	return nil
}

// Unmount unmounts, lazily when busy (a loop device still attached): the
// connection is closed right after, so nothing can use it anyway.
func (HostKernel) Unmount(mountpoint string) error {
	err := unix.Unmount(mountpoint, 0)
	if errors.Is(err, unix.EBUSY) {
		err = unix.Unmount(mountpoint, unix.MNT_DETACH)
	}
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", mountpoint, err)
	}
	return nil
}

// Mounted reads mountinfo rather than stat'ing the path: a dead FUSE mount
// answers stat with ENOTCONN.
func (HostKernel) Mounted(mountpoint string) (bool, error) {
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(mountpoint))
	if err != nil {
		return false, fmt.Errorf("read mountinfo: %w", err)
	}
	return len(ms) > 0, nil
}

// CloseFD closes fd.
func (HostKernel) CloseFD(fd int) error { return unix.Close(fd) }

// WatchProcess uses a pidfd: unlike a pid it cannot be reused by another
// process, and it becomes readable when the process exits.
func (HostKernel) WatchProcess(pid int32) (Process, error) {
	fd, err := unix.PidfdOpen(int(pid), 0)
	if err != nil {
		return nil, fmt.Errorf("watch process %d: %w", pid, err)
	}
	return pidfd(fd), nil
}

type pidfd int

// Alive reports false once the process has exited (even if not reaped yet:
// a zombie answers no requests).
func (p pidfd) Alive() bool {
	fds := []unix.PollFd{{Fd: int32(p), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n == 0
}

// Stop signals through the pidfd, so a reused pid is never hit.
func (p pidfd) Stop(wait time.Duration) error {
	for _, sig := range []unix.Signal{unix.SIGTERM, unix.SIGKILL} {
		if err := unix.PidfdSendSignal(int(p), sig, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("signal: %w", err)
		}
		fds := []unix.PollFd{{Fd: int32(p), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, int(wait.Milliseconds())); err == nil && n > 0 {
			return nil
		}
	}
	return fmt.Errorf("process did not exit within %s of SIGKILL", wait)
}

// Release closes the pidfd.
func (p pidfd) Release() { _ = unix.Close(int(p)) }

// FD is the pidfd itself: passing it rather than a pid means no reuse of
// the pid can make the next keeper watch another process.
func (p pidfd) FD() int { return int(p) }

// /dev/fuse is the misc device 10:229.
const fuseMajor, fuseMinor = 10, 229

// CheckFUSE checks the device behind fd.
func (HostKernel) CheckFUSE(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat passed fd: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != fuseMajor || unix.Minor(st.Rdev) != fuseMinor {
		return fmt.Errorf("passed fd is not /dev/fuse (mode %o, device %d:%d)", st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev))
	}
	return nil
}

// AdoptProcess reads the pid from the fd's fdinfo, which only a pidfd has,
// in this process's pid namespace (-1 once the process has exited).
func (HostKernel) AdoptProcess(fd int) (Process, int32, error) {
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		return nil, 0, fmt.Errorf("read fdinfo of passed fd: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		v, ok := bytes.CutPrefix(sc.Bytes(), []byte("Pid:"))
		if !ok {
			continue
		}
		pid, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 32)
		if err != nil {
			return nil, 0, fmt.Errorf("passed pidfd: bad pid %q", v)
		}
		return pidfd(fd), int32(max(pid, 0)), nil
	}
	return nil, 0, errors.New("passed fd is not a pidfd")
}
