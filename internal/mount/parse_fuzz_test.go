package mount

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// mountinfoSample is /proc/self/mountinfo of this project's test machine
// while a test had a tmpfs at a path with a space, an ext4 loop device and a
// bind-mounted device node mounted, plus the keeper's FUSE mount.
const mountinfoSample = `27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard,resv_strict,resuid=65534,resgid=65534
24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw,size=12334524k,nr_inodes=3083631,mode=755
25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24684096k
42 27 0:39 / /tmp/fuzzcap/sp\040ace rw,relatime - tmpfs tmpfs rw,size=1024k
43 27 7:0 / /tmp/fuzzcap/blk rw,relatime - ext4 /dev/loop0 rw
44 27 0:6 /loop0 /tmp/fuzzcap/bindfile/dev rw,relatime - devtmpfs devtmpfs rw,size=12334524k,nr_inodes=3083631,mode=755
45 27 0:40 / /var/lib/berth/fuse/pvc-1 rw,nosuid,nodev,noexec,relatime shared:1 - fuse.berth berth:pvc-1 rw,user_id=0,group_id=0,allow_other
`

// escapeMountinfo is the kernel's escaping of paths in mountinfo.
func escapeMountinfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == ' ' || c == '\t' || c == '\n' || c == '\\' {
			fmt.Fprintf(&b, `\%03o`, c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// FuzzMountInfo parses mountinfo text as the stage and unstage paths read
// it, and checks that paths survive the kernel's escaping.
func FuzzMountInfo(f *testing.F) {
	f.Add([]byte(mountinfoSample))
	if live, err := os.ReadFile(mountInfoPath); err == nil {
		f.Add(live)
	}
	f.Add([]byte(`1 2 3:4 /a\134040b /m\0 rw - ext4 /dev/x rw`))
	f.Add([]byte("1 2 3:4 / /m rw shared:1 -\n"))
	// A memfd, not a file on disk: a truncate per input on a disk mounted
	// with discard runs the fuzzer at a few hundred inputs a second.
	fd, err := unix.MemfdCreate("mountinfo", unix.MFD_CLOEXEC)
	if err != nil {
		f.Fatal(err)
	}
	mem := os.NewFile(uintptr(fd), "mountinfo")
	f.Cleanup(func() { _ = mem.Close() })
	path := fmt.Sprintf("/proc/self/fd/%d", fd)
	write := func(t *testing.T, data []byte) {
		if err := mem.Truncate(0); err != nil {
			t.Fatal(err)
		}
		if _, err := mem.WriteAt(data, 0); err != nil {
			t.Fatal(err)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		write(t, data)
		mis, err := parseMountInfo(path)
		if err != nil {
			return
		}
		var b strings.Builder
		for i := range mis {
			mi := &mis[i]
			if top := mountAt(mis, mi.MountPoint); top == nil || top.MountPoint != mi.MountPoint {
				t.Fatalf("mountAt(%q) = %v", mi.MountPoint, top)
			}
			if slices.Contains(refs(mis, mi, false), mi.MountPoint) {
				t.Fatalf("%q refers to itself", mi.MountPoint)
			}
			_ = boundDevice(mis, mi)
			// Written back as the kernel writes it, it parses the same.
			fmt.Fprintf(&b, "%d %d %d:%d %s %s %s - %s %s %s\n", mi.ID, mi.ParentID, mi.Major, mi.Minor,
				escapeMountinfo(mi.Root), escapeMountinfo(mi.MountPoint), orRW(mi.MountOptions),
				mi.FsType, mi.Source, orRW(mi.SuperOptions))
			if rawSpace(mi.Root) || rawSpace(mi.MountPoint) {
				return
			}
		}
		write(t, []byte(b.String()))
		again, err := parseMountInfo(path)
		if err != nil || len(again) != len(mis) {
			t.Fatalf("written back: %d entries, %v; want %d", len(again), err, len(mis))
		}
		for i := range mis {
			a, w := again[i], mis[i]
			if a.MountPoint != w.MountPoint || a.Root != w.Root || a.Major != w.Major || a.Minor != w.Minor || a.Source != w.Source {
				t.Fatalf("entry %d: %+v, want %+v", i, a, w)
			}
		}
	})
}

func orRW(opts []string) string {
	if len(opts) == 0 {
		return "rw"
	}
	return strings.Join(opts, ",")
}

// rawSpace: white space the kernel prints unescaped (\r, \v, \f, U+0085,
// U+00A0) splits a field for mount-utils' parser, so such a path cannot be
// read back. Kubelet's and berth's mount paths never hold it.
func rawSpace(s string) bool {
	return len(strings.Fields(escapeMountinfo(s))) != 1
}

// FuzzUnescapeOctal: unescaping undoes the kernel's escaping of any path.
func FuzzUnescapeOctal(f *testing.F) {
	f.Add("/var/lib/kubelet/pods/x/volumes/kubernetes.io~csi/my vol/mount")
	f.Add(`a\b\\c	d` + "\n")
	f.Add(`\134040`)
	f.Fuzz(func(t *testing.T, s string) {
		if got := unescapeOctal(escapeMountinfo(s)); got != s {
			t.Fatalf("unescape(escape(%q)) = %q", s, got)
		}
		if !strings.Contains(s, `\`) && unescapeOctal(s) != s {
			t.Fatalf("%q changed without an escape", s)
		}
		if len(unescapeOctal(s)) > len(s) {
			t.Fatalf("%q grew", s)
		}
	})
}

// losetup's real output on this project's test machine.
const (
	losetupShow     = "/dev/loop0\n"
	losetupShowWarn = "losetup: /dev/shm/fz.img: failed to set direct io: Invalid argument\n/dev/loop0\n"
)

// FuzzLosetupOutput parses what losetup prints for attach: any device it
// returns is a loop device's clean one-field path under /dev/.
func FuzzLosetupOutput(f *testing.F) {
	f.Add(losetupShow)
	f.Add(losetupShowWarn)
	f.Add("/dev/../etc/passwd 0\n/dev/loop 7\n")
	f.Fuzz(func(t *testing.T, out string) {
		dev := parseShown(out)
		if dev != "" && (!strings.HasPrefix(dev, "/dev/loop") || filepath.Clean(dev) != dev || len(strings.Fields(dev)) != 1) {
			t.Fatalf("device %q from %q", dev, out)
		}
		if dev != "" && parseShown(out+"\n"+dev+"\n") != dev {
			t.Fatalf("%q shown last not read", dev)
		}
	})
}

// FuzzLoopSysfs lays out /sys/block/<name>/loop/backing_file and ro as the
// kernel would, with a fuzzed device name and contents, and checks what
// Bound lists and which files a lookup would ask the device about.
func FuzzLoopSysfs(f *testing.F) {
	f.Add("loop3", "/var/lib/berth/images/pvc-1.img\n", "0\n", "/var/lib/berth/images/pvc-1.img")
	f.Add("loop12", "/disk.img\n", "1\n", "/run/berth/fuse/pvc-2/disk.img")
	f.Add("loop0", "/a/b.img (deleted)\n", "0\n", "/a/b.img")
	f.Add("loop01", "/\n", "0\n", "/x")
	f.Add("loop7", "/img\n", "0\n", "/other/img2")
	base := f.TempDir()
	f.Fuzz(func(t *testing.T, name, backing, ro, file string) {
		if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") || len(name) > 200 {
			return // not a file name
		}
		sysfs, err := os.MkdirTemp(base, "")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = os.RemoveAll(sysfs) }()
		dir := filepath.Join(sysfs, "block", name)
		if err := os.MkdirAll(filepath.Join(dir, "loop"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "loop", "backing_file"), []byte(backing), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "ro"), []byte(ro), 0o644); err != nil {
			t.Fatal(err)
		}
		bound, err := sysLoop{sysfs: sysfs}.Bound()
		if err != nil {
			t.Fatal(err)
		}
		if want := isDevPath("/dev/" + name); len(bound) != map[bool]int{true: 1}[want] {
			t.Fatalf("dir %q: listed %v", name, bound)
		}
		for _, b := range bound {
			if b.Dev != "/dev/"+name || b.Backing != strings.TrimSuffix(backing, "\n") || b.ReadOnly != (strings.TrimSpace(ro) == "1") {
				t.Fatalf("dir %q backing %q ro %q: listed %+v", name, backing, ro, b)
			}
			// A device is asked about file only when sysfs names file, or a
			// tail of it that starts at a path component.
			may := mayBeOver(file, b.Backing)
			tail := strings.HasPrefix(b.Backing, "/") && b.Backing != "/" && strings.HasSuffix(file, b.Backing)
			if may != (b.Backing == file || tail) {
				t.Fatalf("file %q, sysfs %q: may be over: %v", file, b.Backing, may)
			}
		}
	})
}
