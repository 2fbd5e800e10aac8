package mount

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	mountutils "k8s.io/mount-utils"
)

// mountInfoPath is this process's mount table, with major:minor and root of
// every mount: what tells bind mounts of one device apart.
const mountInfoPath = "/proc/self/mountinfo"

func readMountInfo() ([]mountutils.MountInfo, error) { return parseMountInfo(mountInfoPath) }

// parseMountInfo reads a mountinfo file and unescapes its paths.
func parseMountInfo(path string) ([]mountutils.MountInfo, error) {
	mis, err := mountutils.ParseMountInfo(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	for i := range mis {
		mis[i].MountPoint = unescapeOctal(mis[i].MountPoint)
		mis[i].Root = unescapeOctal(mis[i].Root)
	}
	return mis, nil
}

// unescapeOctal undoes the kernel's \ooo escaping of spaces, tabs, newlines
// and backslashes in mountinfo paths.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// canonical resolves symlinks where it can; a stale mount cannot be
// resolved, so the cleaned path stands in for it.
func canonical(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return filepath.Clean(p)
}

// mountAt returns the top-most mount on path, nil when none.
func mountAt(mis []mountutils.MountInfo, path string) *mountutils.MountInfo {
	var top *mountutils.MountInfo
	for i := range mis {
		if mis[i].MountPoint == path {
			top = &mis[i] // later lines are mounted on top of earlier ones
		}
	}
	return top
}

// refs lists the other mounts of what mi shows: for a filesystem, any mount
// of the same device (any root pins it); for a bound device node, the mounts
// of the same node (same major:minor of the devtmpfs and same root).
func refs(mis []mountutils.MountInfo, mi *mountutils.MountInfo, block bool) []string {
	var out []string
	for i := range mis {
		o := &mis[i]
		if o.MountPoint == mi.MountPoint || o.Major != mi.Major || o.Minor != mi.Minor {
			continue
		}
		if block && o.Root != mi.Root {
			continue
		}
		out = append(out, o.MountPoint)
	}
	return out
}

// boundDevice names the device node a device bind mount shows: the devtmpfs
// root joined with the mount's root.
func boundDevice(mis []mountutils.MountInfo, mi *mountutils.MountInfo) string {
	base := "/dev"
	for i := range mis {
		o := &mis[i]
		if o.Major == mi.Major && o.Minor == mi.Minor && o.Root == "/" {
			base = o.MountPoint
			break
		}
	}
	return filepath.Join(base, mi.Root)
}

// fsDevice names the block device a filesystem mount shows; "" when it is
// not a block device (e.g. a FUSE mount).
func fsDevice(mi *mountutils.MountInfo) string {
	if strings.HasPrefix(mi.Source, "/dev/") {
		return mi.Source
	}
	// Source is free text for some filesystems; sysfs knows the name.
	link, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%d:%d", mi.Major, mi.Minor))
	if err != nil {
		return ""
	}
	return "/dev/" + filepath.Base(link)
}

// sameDevice tells whether path names the device major:minor.
func sameDevice(path string, major, minor int) bool {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return false
	}
	return int(unix.Major(st.Rdev)) == major && int(unix.Minor(st.Rdev)) == minor
}

func isReadOnly(opts []string) bool { return slices.Contains(opts, "ro") }

// procOpeners lists processes holding the device node open, by scanning
// /proc/*/fd: a bound device node has no mount that would show such a user.
func procOpeners(dev string) ([]int, error) {
	if dev == "" {
		return nil, nil
	}
	var want unix.Stat_t
	if err := unix.Stat(dev, &want); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, nil
		}
		return nil, fmt.Errorf("stat %s: %w", dev, err)
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		fdDir := filepath.Join("/proc", p.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue // gone, or a kernel thread
		}
		for _, fd := range fds {
			var st unix.Stat_t
			if unix.Stat(filepath.Join(fdDir, fd.Name()), &st) != nil {
				continue
			}
			if st.Mode&unix.S_IFMT == unix.S_IFBLK && st.Rdev == want.Rdev {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids, nil
}
