package mount

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/volerr"
)

// ErrNoNFSClient: this node cannot mount NFS with the kernel client, so it
// cannot use read-write-many volumes (shared over NFS).
var ErrNoNFSClient = volerr.New(volerr.ErrPrecondition, "this node has no kernel NFS client")

// NFSClient finds out whether the kernel can mount NFSv4: the filesystem
// registered (/proc/filesystems) or its module present to be loaded, and
// the mount.nfs helper that resolves the server's name.
type NFSClient struct {
	// Filesystems is /proc/filesystems; Modules the running kernel's
	// module dir (/lib/modules/<release>); Helpers the mount.nfs paths.
	Filesystems, Modules string
	Helpers              []string
}

// HostNFSClient is NFSClient over this machine's files.
func HostNFSClient() NFSClient {
	var u unix.Utsname
	release := ""
	if unix.Uname(&u) == nil {
		release = unix.ByteSliceToString(u.Release[:])
	}
	return NFSClient{Filesystems: "/proc/filesystems", Modules: filepath.Join("/lib/modules", release),
		Helpers: []string{"/sbin/mount.nfs4", "/usr/sbin/mount.nfs4", "/sbin/mount.nfs", "/usr/sbin/mount.nfs"}}
}

// Check returns nil when NFSv4 mounts can work here, else ErrNoNFSClient
// saying what is missing.
func (c NFSClient) Check() error {
	kernel, err := c.kernelHasNFS4()
	if err != nil {
		return err
	}
	if !kernel {
		return fmt.Errorf("%w: nfs4 is not in %s and no nfsv4 module is in %s (install or enable the kernel's NFS client, or run RWX workloads on nodes that have it)",
			ErrNoNFSClient, c.Filesystems, c.Modules)
	}
	for _, h := range c.Helpers {
		if _, err := os.Stat(h); err == nil {
			return nil
		}
	}
	return fmt.Errorf("%w: no mount.nfs helper (%s): install nfs-common or nfs-utils", ErrNoNFSClient, strings.Join(c.Helpers, ", "))
}

func (c NFSClient) kernelHasNFS4() (bool, error) {
	data, err := os.ReadFile(c.Filesystems)
	if err != nil {
		return false, fmt.Errorf("read %s: %w", c.Filesystems, err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[len(f)-1] == "nfs4" {
			return true, nil
		}
	}
	if c.Modules == "" {
		return false, nil
	}
	// Not loaded yet: mount loads it on demand when the module is there.
	for _, p := range []string{"kernel/fs/nfs/nfsv4.ko", "kernel/fs/nfs/nfsv4.ko.xz", "kernel/fs/nfs/nfsv4.ko.zst", "kernel/fs/nfs/nfsv4.ko.gz"} {
		if _, err := os.Stat(filepath.Join(c.Modules, p)); err == nil {
			return true, nil
		}
	}
	builtin, err := os.ReadFile(filepath.Join(c.Modules, "modules.builtin"))
	if err != nil && !os.IsNotExist(err) {
		return false, err
	}
	return strings.Contains(string(builtin), "fs/nfs/nfsv4.ko"), nil
}
