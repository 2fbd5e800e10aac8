package image

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/go-logr/logr"
	utilexec "k8s.io/utils/exec"

	"github.com/berth-io/berth/internal/blockdev/launch"
	"github.com/berth-io/berth/internal/flexvolume"
	"github.com/berth-io/berth/internal/share"
)

// Default tags of the images the e2e cluster imports.
const (
	PauseTag   = "registry.k8s.io/pause:3.10"
	BusyboxTag = "berth.local/busybox:e2e"
	BerthTag   = "berth.local/berth:dev"
)

// imagePath is PATH inside the images built here.
const imagePath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Builder assembles image specs from binaries on this machine. It runs
// `busybox --list-full` and `ldd` through Exec.
type Builder struct {
	Exec utilexec.Interface
	Log  logr.Logger
}

// NewBuilder returns a Builder that runs real commands.
func NewBuilder(log logr.Logger) *Builder {
	return &Builder{Exec: utilexec.New(), Log: log}
}

// PauseSpec is the sandbox image: one static binary at /pause.
func PauseSpec(pauseBinary string) Spec {
	return Spec{
		Tag:        PauseTag,
		Files:      []File{{Path: "/pause", Source: pauseBinary, Mode: 0o755}},
		Entrypoint: []string{"/pause"},
	}
}

// BusyboxSpec is a static busybox with one symlink per applet, the way
// Debian's busybox-static lists them.
func (b *Builder) BusyboxSpec(busybox, tag string) (Spec, error) {
	out, err := b.Exec.Command(busybox, "--list-full").Output()
	if err != nil {
		return Spec{}, fmt.Errorf("list applets of %s: %w", busybox, err)
	}
	files := []File{{Path: "/bin/busybox", Source: busybox, Mode: 0o755}, {Path: "/tmp", Dir: true, Mode: 0o1777}}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		applet := "/" + strings.TrimSpace(sc.Text())
		if applet == "/" || applet == "/bin/busybox" {
			continue
		}
		files = append(files, File{Path: path.Clean(applet), Link: "/bin/busybox"})
	}
	return Spec{Tag: tag, Files: files, Cmd: []string{"/bin/sh"}, Env: []string{imagePath}}, nil
}

// AgnhostSpec is the Kubernetes e2e suite's agnhost (built from
// k8s.io/kubernetes/test/images/agnhost) as the entrypoint of a busybox
// image: the suite runs `agnhost pause` / `agnhost mounttest` as arguments
// and execs sh, nsenter, mount, dd and the like inside the container.
func (b *Builder) AgnhostSpec(busybox, agnhost, tag string) (Spec, error) {
	spec, err := b.BusyboxSpec(busybox, tag)
	if err != nil {
		return Spec{}, err
	}
	spec.Files = append(spec.Files, File{Path: "/agnhost", Source: agnhost, Mode: 0o755})
	spec.Entrypoint, spec.Cmd = []string{"/agnhost"}, nil
	return spec, nil
}

// BerthTools are the programs berth execs: required ones fail the build
// when missing, optional ones are skipped with a log line. fio is not among
// them: Debian's links 80 MiB of Ceph and Gluster libraries; pass it as an
// extra tool when an image needs it.
func BerthTools() (required, optional []string) {
	// Stage grows an existing ext4 (a restore, a clone, a grown volume)
	// with dumpe2fs, blockdev, e2fsck and resize2fs: all required.
	// The share manager of an RWX volume runs nfs-ganesha; the agent
	// mounts a share with the kernel NFS client through mount.nfs.
	return []string{"losetup", "mkfs.ext4", "mkfs.xfs", "resize2fs", "xfs_growfs", "blkid", "mount", "umount",
			"dumpe2fs", "e2fsck", "blockdev", "ganesha.nfsd", "mount.nfs"},
		[]string{"fsck", "fsck.ext4", "xfs_repair", "nsenter"}
}

// BerthSpec is the berth image: the berth binary at /usr/local/bin/berth
// (the entrypoint) with the shared libraries it loads (librbd, librados and
// theirs, when it is built with the ceph backend), its static build beside
// it when there is one (flexvolume.StaticBinary), plus the tools it execs
// (BerthTools and extraTools, all required) and ganesha's VFS FSAL, each at
// its path on this machine with the shared libraries it loads.
func (b *Builder) BerthSpec(berthBinary, tag string, extraTools ...string) (Spec, error) {
	if _, err := os.Stat(berthBinary); err != nil {
		return Spec{}, fmt.Errorf("%w: berth binary: %w", ErrInvalidSpec, err)
	}
	files := append(berthBinaries(berthBinary), File{Path: "/tmp", Dir: true, Mode: 0o1777})
	seen := map[string]bool{}
	add := func(p string) {
		if !seen[p] {
			seen[p] = true
			files = append(files, File{Path: p, Source: p})
		}
	}
	libs, err := b.sharedLibs(berthBinary)
	if err != nil {
		return Spec{}, err
	}
	for _, l := range libs {
		add(l)
	}
	required, optional := BerthTools()
	required = append(required, extraTools...)
	found := map[string]string{} // tool -> its absolute path here
	for i, tool := range append(required, optional...) {
		p, err := b.Exec.LookPath(tool)
		if err != nil {
			if i < len(required) {
				return Spec{}, fmt.Errorf("%w: tool %s: %w", ErrInvalidSpec, tool, err)
			}
			b.Log.Info("optional tool not found, left out of the image", "tool", tool)
			continue
		}
		p, err = filepath.Abs(p)
		if err != nil {
			return Spec{}, fmt.Errorf("path of %s: %w", tool, err)
		}
		found[tool] = p
		add(p)
		libs, err := b.sharedLibs(p)
		if err != nil {
			return Spec{}, err
		}
		for _, l := range libs {
			add(l)
		}
	}
	// ganesha loads its VFS FSAL at run time (dlopen: ldd of ganesha.nfsd
	// does not list it), from the Plugins_Dir the share manager configures.
	fsal := path.Join(share.PluginsDir, "libfsalvfs.so")
	if _, err := os.Stat(fsal); err != nil {
		return Spec{}, fmt.Errorf("%w: ganesha's VFS FSAL (Debian package nfs-ganesha-vfs): %w", ErrInvalidSpec, err)
	}
	add(fsal)
	libs, err = b.sharedLibs(fsal)
	if err != nil {
		return Spec{}, err
	}
	for _, l := range libs {
		add(l)
	}
	// ganesha's RPC library reads the transports from /etc/netconfig, and
	// its VFS FSAL finds the exported filesystem in /etc/mtab; it keeps
	// its callback credential cache under /var/run/ganesha.
	if _, err := os.Stat("/etc/netconfig"); err != nil {
		return Spec{}, fmt.Errorf("%w: ganesha's /etc/netconfig (Debian package libtirpc-common): %w", ErrInvalidSpec, err)
	}
	add("/etc/netconfig")
	files = append(files, ganeshaEntries...)
	// mount.nfs looks its transport up by name (getprotobyname "tcp").
	if _, err := os.Stat("/etc/protocols"); err != nil {
		return Spec{}, fmt.Errorf("%w: mount.nfs's /etc/protocols (Debian package netbase): %w", ErrInvalidSpec, err)
	}
	add("/etc/protocols")
	// mount(8) looks for its NFS helper (a required tool) in /sbin
	// (libmount's helper path); on a merged-/usr host it is in /usr/sbin.
	for _, helper := range []string{"/sbin/mount.nfs", "/sbin/mount.nfs4"} {
		if nfs := found["mount.nfs"]; helper != nfs {
			files = append(files, File{Path: helper, Link: nfs})
		}
	}
	// mke2fs reads its defaults from here; without it mkfs.ext4 still works
	// but with compiled-in (older) features.
	if _, err := os.Stat("/etc/mke2fs.conf"); err == nil {
		add("/etc/mke2fs.conf")
	}
	return Spec{
		Tag:        tag,
		Files:      files,
		Entrypoint: []string{berthEntrypoint},
		Env:        []string{imagePath},
	}, nil
}

// ganeshaEntries are the link and the folder ganesha needs that no
// package ships: /etc/mtab and ganesha's callback credential cache.
var ganeshaEntries = []File{{Path: "/etc/mtab", Link: "../proc/self/mounts"}, {Path: "/var/run/ganesha", Dir: true, Mode: 0o700}}

// berthEntrypoint is berth in its image; the binaries the agent looks for
// beside berth are in the same folder.
const berthEntrypoint = "/usr/local/bin/berth"

// berthBinaries are the image's files of berth and of the binaries beside
// it, each when there is one: its static build, which the agent installs as
// the host's Flexvolume driver, and the server binaries, which the agent
// runs for the blockdev servers of file images and of rbd images.
func berthBinaries(berthBinary string) []File {
	dir := path.Dir(berthEntrypoint)
	files := []File{{Path: berthEntrypoint, Source: berthBinary, Mode: 0o755}}
	if driver := flexvolume.DriverBinary(berthBinary); driver != berthBinary {
		files = append(files, File{Path: path.Join(dir, flexvolume.StaticBinary), Source: driver, Mode: 0o755})
	}
	if slim := launch.SlimBinary(berthBinary); slim != "" {
		files = append(files, File{Path: path.Join(dir, launch.SlimBinaryName), Source: slim, Mode: 0o755})
	}
	// Its libraries (librbd, librados) are berth's own, already in.
	if ceph := launch.CephBinary(berthBinary); ceph != "" {
		files = append(files, File{Path: path.Join(dir, launch.CephBinaryName), Source: ceph, Mode: 0o755})
	}
	return files
}

// sharedLibs returns the absolute paths ldd resolves for bin (its dynamic
// loader included); none for a static binary.
func (b *Builder) sharedLibs(bin string) ([]string, error) {
	out, err := b.Exec.Command("ldd", bin).CombinedOutput()
	if err != nil {
		var exitErr utilexec.ExitError
		if errors.As(err, &exitErr) && bytes.Contains(out, []byte("not a dynamic executable")) {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %w: %s", bin, err, out)
	}
	return parseLdd(out)
}

// parseLdd reads lines such as
//
//	libblkid.so.1 => /lib/x86_64-linux-gnu/libblkid.so.1 (0x7f...)
//	/lib64/ld-linux-x86-64.so.2 (0x7f...)
//	linux-vdso.so.1 (0x7ffd...)
func parseLdd(out []byte) ([]string, error) {
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.Contains(line, "statically linked") {
			return nil, nil
		}
		if strings.Contains(line, "=> not found") {
			return nil, fmt.Errorf("%w: missing library: %s", ErrInvalidSpec, line)
		}
		if _, after, ok := strings.Cut(line, "=> "); ok {
			line = after
		}
		p, _, _ := strings.Cut(line, " ")
		if path.IsAbs(p) {
			libs = append(libs, p)
		}
	}
	return libs, nil
}

// BuildBerthImage writes the berth image (tag BerthTag) of berthBinary to out.
func BuildBerthImage(berthBinary, out string) error {
	spec, err := NewBuilder(logr.Discard()).BerthSpec(berthBinary, BerthTag)
	if err != nil {
		return err
	}
	return Write(spec, out)
}
