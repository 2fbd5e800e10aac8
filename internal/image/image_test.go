package image

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
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
	out := filepath.Join(t.TempDir(), "busybox.tar")
	if err := Write(spec, out); err != nil {
		t.Fatal(err)
	}
	_, files := readImage(t, out, BusyboxTag)
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
	out := filepath.Join(t.TempDir(), "agnhost.tar")
	if err := Write(spec, out); err != nil {
		t.Fatal(err)
	}
	ep, files := readImage(t, out, tag)
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
	berth := filepath.Join(t.TempDir(), "berth")
	if err := os.WriteFile(berth, []byte("stand-in"), 0o755); err != nil {
		t.Fatal(err)
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
	if _, ok := files["lib64/ld-linux-x86-64.so.2"]; !ok {
		t.Error("dynamic loader missing")
	}
	if err := BuildBerthImage(filepath.Join(t.TempDir(), "absent"), out+".2"); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("missing berth binary: %v", err)
	}
}
