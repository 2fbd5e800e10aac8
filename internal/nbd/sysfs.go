package nbd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// BackendID is the identifier node's device of a volume carries in
// /sys/block/nbdN/backend, by which a restarted server finds it. nbd
// devices are the kernel's, seen by every node sharing it (Kubernetes
// nodes in containers or namespaces of one machine): the node name keeps
// one node's agent from finding, reconnecting or disconnecting the device
// another node made for the same volume (a moved or read-only-many one).
// A node name has no "/" (a DNS subdomain); "" gives the single-node form.
func BackendID(node, volume string) string {
	if node == "" {
		return "berth:" + volume
	}
	return "berth:" + node + "/" + volume
}

// DevicePath is the device node of nbd index.
func DevicePath(index int) string { return "/dev/nbd" + strconv.Itoa(index) }

// FindByBackend scans <sysfs>/block/nbd*/backend for id. The kernel makes
// the file at CONNECT (empty without an identifier) and removes it with the
// configuration: after DISCONNECT once the last opener closes the device.
// It survives the server's death and the dead-connection timeout.
func FindByBackend(sysfs, id string) (index int, found bool, err error) {
	dirs, err := filepath.Glob(filepath.Join(sysfs, "block", "nbd*"))
	if err != nil {
		return 0, false, fmt.Errorf("list nbd devices: %w", err)
	}
	for _, dir := range dirs {
		name := strings.TrimPrefix(filepath.Base(dir), "nbd")
		idx, err := strconv.Atoi(name)
		if err != nil || strconv.Itoa(idx) != name {
			continue // a partition or something else, not nbdN (nbd+1 or nbd01 would name another device)
		}
		b, err := os.ReadFile(filepath.Join(dir, "backend"))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, false, fmt.Errorf("read backend of nbd%d: %w", idx, err)
		}
		if strings.TrimRight(string(b), "\n") == id {
			return idx, true, nil
		}
	}
	return 0, false, nil
}

// Available tells whether this kernel has the nbd driver loaded (or built
// in), and why not when it has not.
func Available(sysfs string) (ok bool, reason string) {
	dir := filepath.Join(sysfs, "module", "nbd")
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, fmt.Sprintf("the kernel has no nbd driver: %s does not exist (load it with `modprobe nbd`)", dir)
	case err != nil:
		return false, fmt.Sprintf("cannot tell whether the kernel has nbd: %v", err)
	case !st.IsDir():
		return false, fmt.Sprintf("%s is not a directory", dir)
	}
	return true, ""
}
