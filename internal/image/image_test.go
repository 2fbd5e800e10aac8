package image

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/berth-io/berth/internal/flexvolume"
	"github.com/berth-io/berth/internal/share"
	"github.com/berth-io/berth/internal/share/nfsclient"
	"github.com/berth-io/berth/internal/testenv"
)

type entry struct {
	typ  byte
	mode int64
	link string
	data string
}

// readImage loads out as tag and returns its config entrypoint and files.
func readImage(t *testing.T, out, tag string) ([]string, map[string]entry) {
	t.Helper()
	ref, err := name.NewTag(tag)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(out, &ref)
	if err != nil {
		t.Fatalf("read %s as %s: %v", out, tag, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Fatalf("platform %s/%s, want linux/amd64", cf.OS, cf.Architecture)
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	files := map[string]entry{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		files[strings.TrimSuffix(h.Name, "/")] = entry{typ: h.Typeflag, mode: h.Mode, link: h.Linkname, data: string(data)}
	}
	return cf.Config.Entrypoint, files
}

// written writes spec's image and reads it back (see readImage).
func written(t *testing.T, spec Spec) ([]string, map[string]entry) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "image.tar")
	if err := Write(spec, out); err != nil {
		t.Fatal(err)
	}
	return readImage(t, out, spec.Tag)
}

func TestWriteRoundTrip(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "prog")
	if err := os.WriteFile(src, []byte("#!/bin/true\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "img.tar")
	spec := Spec{
		Tag: "berth.local/test:1",
		Files: []File{
			{Path: "/usr/bin/prog", Source: src, Mode: 0o755},
			{Path: "/bin/alias", Link: "/usr/bin/prog"},
			{Path: "/tmp", Dir: true, Mode: 0o1777},
		},
		Entrypoint: []string{"/usr/bin/prog"},
	}
	if err := Write(spec, out); err != nil {
		t.Fatal(err)
	}
	ep, files := readImage(t, out, spec.Tag)
	if !slices.Equal(ep, spec.Entrypoint) {
		t.Errorf("entrypoint %v", ep)
	}
	if f := files["usr/bin/prog"]; f.typ != tar.TypeReg || f.mode != 0o755 || f.data != "#!/bin/true\n" {
		t.Errorf("prog entry %+v", f)
	}
	if f := files["bin/alias"]; f.typ != tar.TypeSymlink || f.link != "/usr/bin/prog" {
		t.Errorf("alias entry %+v", f)
	}
	if f := files["tmp"]; f.typ != tar.TypeDir || f.mode != 0o1777 {
		t.Errorf("tmp entry %+v", f)
	}
	if f := files["usr"]; f.typ != tar.TypeDir {
		t.Errorf("parent dir usr/ missing: %+v", f)
	}

	// Same inputs, same bytes: a rebuild does not change the image ID.
	first, _ := os.ReadFile(out)
	if err := Write(spec, out); err != nil {
		t.Fatal(err)
	}
	if second, _ := os.ReadFile(out); string(first) != string(second) {
		t.Error("rewriting the same spec changed the tarball")
	}
}

func TestWriteRejectsBadSpecAndWritesNothing(t *testing.T) {
	dir := t.TempDir()
	cases := map[string]Spec{
		"bad tag":       {Tag: "UPPER CASE", Files: []File{{Path: "/d", Dir: true}}},
		"relative path": {Tag: "a/b:c", Files: []File{{Path: "d", Dir: true}}},
		"two kinds":     {Tag: "a/b:c", Files: []File{{Path: "/d", Dir: true, Link: "/x"}}},
		"missing file":  {Tag: "a/b:c", Files: []File{{Path: "/f", Source: filepath.Join(dir, "absent")}}},
	}
	for name, spec := range cases {
		out := filepath.Join(dir, "out.tar")
		err := Write(spec, out)
		if err == nil {
			t.Errorf("%s: no error", name)
		}
		if name != "missing file" && !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("%s: %v is not ErrInvalidSpec", name, err)
		}
		if _, statErr := os.Stat(out); !os.IsNotExist(statErr) {
			t.Errorf("%s: %s was written", name, out)
		}
	}
}

func TestParseLdd(t *testing.T) {
	out := []byte(`	linux-vdso.so.1 (0x00007ffd)
	libblkid.so.1 => /lib/x86_64-linux-gnu/libblkid.so.1 (0x00007f01)
	libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f02)
	/lib64/ld-linux-x86-64.so.2 (0x00007f03)
`)
	libs, err := parseLdd(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/lib/x86_64-linux-gnu/libblkid.so.1", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"}
	if !slices.Equal(libs, want) {
		t.Errorf("libs %v, want %v", libs, want)
	}
	if _, err := parseLdd([]byte("libfoo.so => not found\n")); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("missing library: %v", err)
	}
}

func TestBusyboxSpec(t *testing.T) {
	const bb = "/bin/busybox"
	if _, err := os.Stat(bb); err != nil {
		t.Skip("needs Debian busybox-static (hack/install-deps.sh busybox-static)")
	}
	spec, err := NewBuilder(logr.Discard()).BusyboxSpec(bb, BusyboxTag)
	if err != nil {
		t.Fatal(err)
	}
	_, files := written(t, spec)
	if f := files["bin/sh"]; f.typ != tar.TypeSymlink || f.link != "/bin/busybox" {
		t.Errorf("bin/sh entry %+v", f)
	}
	if len(files) < 100 {
		t.Errorf("only %d entries: applet symlinks missing", len(files))
	}
}

func TestAgnhostSpec(t *testing.T) {
	const bb = "/bin/busybox"
	if _, err := os.Stat(bb); err != nil {
		t.Skip("needs Debian busybox-static (hack/install-deps.sh busybox-static)")
	}
	agnhost := filepath.Join(t.TempDir(), "agnhost")
	if err := os.WriteFile(agnhost, []byte("stand-in"), 0o755); err != nil {
		t.Fatal(err)
	}
	const tag = "berth.local/e2e-test-images/agnhost:2.56"
	spec, err := NewBuilder(logr.Discard()).AgnhostSpec(bb, agnhost, tag)
	if err != nil {
		t.Fatal(err)
	}
	ep, files := written(t, spec)
	if !slices.Equal(ep, []string{"/agnhost"}) {
		t.Errorf("entrypoint %v, want [/agnhost]", ep)
	}
	if f := files["agnhost"]; f.typ != tar.TypeReg || f.mode&0o111 == 0 || f.data != "stand-in" {
		t.Errorf("agnhost entry %+v", f)
	}
	// The suite's host-exec pod runs nsenter and sh in this image.
	for _, applet := range []string{"bin/sh", "usr/bin/nsenter"} {
		if f := files[applet]; f.typ != tar.TypeSymlink || f.link != "/bin/busybox" {
			t.Errorf("%s entry %+v", applet, f)
		}
	}
	if _, err := NewBuilder(logr.Discard()).AgnhostSpec(filepath.Join(t.TempDir(), "absent"), agnhost, tag); err == nil {
		t.Error("a missing busybox gave a spec")
	}
}

func TestBerthSpecCarriesToolsAndLibraries(t *testing.T) {
	required, _ := BerthTools()
	b := NewBuilder(logr.Discard())
	for _, tool := range required {
		if _, err := b.Exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (hack/install-deps.sh)", tool)
		}
	}
	dir := t.TempDir()
	berth := filepath.Join(dir, "berth")
	// The static build beside it goes along (the host's Flexvolume driver).
	for _, p := range []string{berth, filepath.Join(dir, flexvolume.StaticBinary)} {
		if err := os.WriteFile(p, []byte("stand-in"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(t.TempDir(), "berth.tar")
	if err := BuildBerthImage(berth, out); err != nil {
		t.Fatal(err)
	}
	ep, files := readImage(t, out, BerthTag)
	if !slices.Equal(ep, []string{"/usr/local/bin/berth"}) {
		t.Errorf("entrypoint %v", ep)
	}
	mkfs, _ := b.Exec.LookPath("mkfs.ext4")
	abs, _ := filepath.Abs(mkfs)
	if f := files[abs[1:]]; f.typ != tar.TypeReg || f.mode&0o111 == 0 {
		t.Errorf("%s entry %+v", abs, f)
	}
	if f := files["usr/local/bin/"+flexvolume.StaticBinary]; f.typ != tar.TypeReg || f.mode&0o111 == 0 {
		t.Errorf("static build entry %+v", f)
	}
	if _, ok := files["lib64/ld-linux-x86-64.so.2"]; !ok {
		t.Error("dynamic loader missing")
	}
	if err := BuildBerthImage(filepath.Join(t.TempDir(), "absent"), out+".2"); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("missing berth binary: %v", err)
	}
}

// The berth image runs its berth: the binary as `make build` makes it (with
// the ceph backend: dynamically linked against librbd and librados) finds
// every library it loads inside the image. The image's files are unpacked
// into a folder and berth runs chrooted there, as a container would run it.
func TestBerthImageRunsItsBerth(t *testing.T) {
	if testing.Short() || os.Geteuid() != 0 {
		t.Skip("needs root (chroot) and builds berth: not with -short")
	}
	required, _ := BerthTools()
	for _, tool := range required {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (hack/install-deps.sh)", tool)
		}
	}
	berth, err := testenv.BuildBerth(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	spec, err := NewBuilder(logr.Discard()).BerthSpec(berth, BerthTag)
	if err != nil {
		t.Fatal(err)
	}
	_, files := written(t, spec)
	root := t.TempDir()
	for name, f := range files {
		p := filepath.Join(root, name)
		switch f.typ {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeSymlink:
			if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
				err = os.Symlink(f.link, p)
			}
		case tar.TypeReg:
			if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
				err = os.WriteFile(p, []byte(f.data), os.FileMode(f.mode)&0o7777)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}

	cmd := exec.Command("/usr/local/bin/berth", "version")
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	cmd.Dir = "/"
	cmd.Env = []string{imagePath}
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("berth version in the image: %v\n%s", err, b)
	}
	t.Logf("in the image: %s", strings.TrimSpace(string(b)))
	want := "local and ceph backends"
	if os.Getenv("BERTH_CEPH") == "0" {
		want = "local backend only"
	}
	if !strings.Contains(string(b), want) {
		t.Errorf("berth version in the image said %q, want %q", b, want)
	}
	if want != "local backend only" {
		for _, lib := range []string{"librbd.so.1", "librados.so.2"} {
			if !hasFile(files, lib) {
				t.Errorf("the image has no %s", lib)
			}
		}
	}
	// A tool runs there too, on its own libraries.
	losetup, _ := exec.LookPath("losetup")
	losetup, _ = filepath.Abs(losetup)
	cmd = exec.Command(losetup, "--version")
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	cmd.Dir = "/"
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("losetup in the image: %v\n%s", err, b)
	}
	// The NFS helper of the agent's kernel NFS mounts runs there and finds
	// what it looks up (the tcp protocol, the server's address); -f stops
	// it short of the mount system call, which this kernel cannot make.
	cmd = exec.Command("/sbin/mount.nfs4", "127.0.0.1:/x", "/tmp", "-f", "-v", "-o", "hard,nfsvers=4.1,proto=tcp,noresvport")
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	cmd.Dir = "/"
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("mount.nfs4 in the image: %v\n%s", err, b)
	}
	ganeshaServesFromImage(t, root)
}

// ganeshaServesFromImage runs the image's nfs-ganesha with the share
// manager's configuration over an export that is a mount point, the way
// the share-manager pod runs it, and asks the export over NFSv4.1. The
// mounts are made in a private mount namespace (unshare), so they go with
// its processes; the root is bound onto itself so that /proc/self/mounts
// shows the export at /export, as in a container.
func ganeshaServesFromImage(t *testing.T, root string) {
	for _, dir := range []string{"proc", "export", "state"} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	exp := t.TempDir()
	port := testenv.FreePort(t)
	conf, err := share.ExportConfig{Path: "/export", Pseudo: "/pv1", BindAddr: "127.0.0.1", Port: port,
		RecoveryRoot: "/export/.recovery", SyncWrites: true}.Render()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "state", "ganesha.conf"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	script := `set -e
mount --bind "$1" "$1"
mount --bind "$2" "$1/export"
mount -t proc proc "$1/proc"
exec chroot "$1" /usr/bin/ganesha.nfsd -F -f /state/ganesha.conf -L /state/ganesha.log -p /state/ganesha.pid`
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", root, exp)
	out, err := os.Create(filepath.Join(t.TempDir(), "ganesha.out"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = out.Close() }()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start ganesha in the image: %v", err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err = nfsclient.CheckExport41(ctx, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), "/pv1", 1, "image-test")
		cancel()
		if err == nil {
			t.Log("the image's ganesha serves the export over NFSv4.1")
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(root, "state", "ganesha.log"))
			o, _ := os.ReadFile(out.Name())
			t.Fatalf("the image's ganesha does not serve: %v\n%s\n%s", err, o, log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// hasFile tells whether the image has a regular file named base.
func hasFile(files map[string]entry, base string) bool {
	for name, f := range files {
		if f.typ == tar.TypeReg && filepath.Base(name) == base {
			return true
		}
	}
	return false
}
