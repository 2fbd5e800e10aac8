package flexvolume

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	securejoin "github.com/cyphar/filepath-securejoin"
)

// HostRoot is the root folder of the node's mount namespace as this
// process reaches it: /proc/<pid>/root of its nearest ancestor in another
// mount namespace (the container runtime's shim, whose namespace is the
// one kubelet and the runtime resolve host paths in), or "/" when every
// ancestor it may inspect shares this process's (berth runs on the host).
//
// Why not a hostPath volume of the plugin folder: kubelet makes a
// DirectoryOrCreate folder before the container starts, and on a node whose
// /usr is read-only it cannot, so the whole agent pod (and CSI with it)
// would never start. Reached this way, the folder that cannot be made fails
// only the Flexvolume install, which the agent reports and retries.
//
// The agent pod shares the host's PID namespace (the operator sets
// hostPID), so its ancestors are visible; without that, the parent is pid 0
// and HostRoot refuses rather than install into the container's own root.
func HostRoot(proc string) (string, error) {
	self, err := os.Readlink(filepath.Join(proc, "self", "ns", "mnt"))
	if err != nil {
		return "", fmt.Errorf("own mount namespace: %w", err)
	}
	pid := os.Getppid()
	for range 64 {
		if pid == 0 {
			return "", fmt.Errorf("no ancestor process visible (is the agent pod in the host's PID namespace, hostPID?)")
		}
		ns, err := os.Readlink(filepath.Join(proc, strconv.Itoa(pid), "ns", "mnt"))
		if errors.Is(err, fs.ErrPermission) {
			// An ancestor even root may not inspect (another user
			// namespace's, such as a sandbox's init): every ancestor
			// below it shares this process's mount namespace, so this
			// one's root is the node's as far as it can be reached.
			return "/", nil
		}
		if err != nil {
			return "", fmt.Errorf("mount namespace of ancestor %d: %w", pid, err)
		}
		if ns != self {
			return filepath.Join(proc, strconv.Itoa(pid), "root"), nil
		}
		if pid == 1 {
			return "/", nil
		}
		if pid, err = parentOf(proc, pid); err != nil {
			return "", err
		}
	}
	return "", fmt.Errorf("no ancestor in another mount namespace within 64 generations")
}

// parentOf reads pid's parent from <proc>/<pid>/status.
func parentOf(proc string, pid int) (int, error) {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, fmt.Errorf("parent of %d: %w", pid, err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			ppid, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return 0, fmt.Errorf("parent of %d: %q: %w", pid, line, err)
			}
			return ppid, nil
		}
	}
	return 0, fmt.Errorf("parent of %d: no PPid line", pid)
}

// InRoot is the host path p below root (HostRoot), its symlinks resolved
// as the host resolves them: an absolute link target stays below root
// instead of leading into this process's own tree.
func InRoot(root, p string) (string, error) {
	if root == "/" || root == "" {
		return filepath.Clean(p), nil
	}
	joined, err := securejoin.SecureJoin(root, p)
	if err != nil {
		return "", fmt.Errorf("resolve %s below the node's root %s: %w", p, root, err)
	}
	return joined, nil
}
