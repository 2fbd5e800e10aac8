package image

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/berth-io/berth/internal/share"
)

// The Containerfile at the repository root builds the berth image with a
// container engine; `make image` writes it from this machine's files
// (BerthSpec). The tests below keep the two recipes in step without an
// engine: same binaries at the same paths, a Debian package for every tool,
// the same entrypoint.

// toolPackages is the Debian 12 package that ships each of BerthTools.
// TestDebianPackagesMatchDpkg checks it against dpkg where it can.
var toolPackages = map[string]string{
	"losetup": "mount", "mount": "mount", "umount": "mount",
	"blkid": "util-linux", "blockdev": "util-linux", "fsck": "util-linux", "nsenter": "util-linux",
	"mkfs.ext4": "e2fsprogs", "resize2fs": "e2fsprogs", "dumpe2fs": "e2fsprogs", "e2fsck": "e2fsprogs", "fsck.ext4": "e2fsprogs",
	"mkfs.xfs": "xfsprogs", "xfs_growfs": "xfsprogs", "xfs_repair": "xfsprogs",
	"ganesha.nfsd": "nfs-ganesha",
	"mount.nfs":    "nfs-common",
}

// filePackages is the Debian 12 package of each other file BerthSpec takes:
// ganesha's VFS FSAL, what ganesha and the tools read in /etc, and the
// libraries of berth's ceph backend.
var filePackages = map[string]string{
	path.Join(share.PluginsDir, "libfsalvfs.so"): "nfs-ganesha-vfs",
	"/etc/netconfig":                          "libtirpc-common",
	"/etc/protocols":                          "netbase",
	"/etc/mke2fs.conf":                        "e2fsprogs",
	"/usr/lib/x86_64-linux-gnu/librbd.so.1":   "librbd1",
	"/usr/lib/x86_64-linux-gnu/librados.so.2": "librados2",
}

// instruction is one Containerfile instruction, its continuation lines
// joined.
type instruction struct {
	cmd, args string
	line      int
}

// stage is one FROM and what follows it.
type stage struct {
	from, name string
	ins        []instruction
}

// containerfile: the ARGs before the first FROM (with their defaults) and
// the stages.
type containerfile struct {
	args   map[string]string
	stages []stage
}

func parseContainerfile(t *testing.T, file string) containerfile {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	cf := containerfile{args: map[string]string{}}
	var cur strings.Builder
	start := 0
	for i, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if body, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		cur.Reset()
		in := instruction{cmd: strings.ToUpper(cmd), args: strings.Join(strings.Fields(args), " "), line: start}
		switch {
		case in.cmd == "FROM":
			from, name, _ := strings.Cut(in.args, " AS ")
			cf.stages = append(cf.stages, stage{from: from, name: name})
		case len(cf.stages) == 0 && in.cmd == "ARG":
			k, v, _ := strings.Cut(in.args, "=")
			cf.args[k] = v
		case len(cf.stages) == 0:
			t.Fatalf("%s:%d: %s before the first FROM", file, in.line, in.cmd)
		default:
			last := &cf.stages[len(cf.stages)-1]
			last.ins = append(last.ins, in)
		}
	}
	if len(cf.stages) < 2 {
		t.Fatalf("%s: %d stages, want a build stage and the image", file, len(cf.stages))
	}
	return cf
}

// all returns the arguments of every cmd instruction of s.
func (s stage) all(cmd string) []string {
	var out []string
	for _, in := range s.ins {
		if in.cmd == cmd {
			out = append(out, in.args)
		}
	}
	return out
}

// installed are the packages shell command lines ask hack/install-deps.sh
// for, each run up to the next &&, || or ; or the end of its line.
func installed(lines string) []string {
	var pkgs []string
	for _, line := range strings.Split(lines, "\n") {
		on := false
		for _, f := range strings.Fields(line) {
			switch {
			case strings.HasSuffix(f, "install-deps.sh") && !strings.HasPrefix(f, "--"):
				on = true
			case f == "&&" || f == ";" || f == "||":
				on = false
			case on:
				pkgs = append(pkgs, f)
			}
		}
	}
	return pkgs
}

// recipe is the command lines of target in the Makefile.
func recipe(t *testing.T, target string) string {
	t.Helper()
	data, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	in := false
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case strings.HasPrefix(line, target+":"):
			in = true
		case in && strings.HasPrefix(line, "\t"):
			lines = append(lines, line)
		case in:
			return strings.Join(lines, "\n")
		}
	}
	t.Fatalf("Makefile has no target %s", target)
	return ""
}

// The builder is Go of go.mod's version on Debian 12, the final stage
// Debian 12 slim, each pinned by tag and digest: BerthSpec takes each tool
// from its path on a Debian 12 machine (share.PluginsDir is Debian's), and
// another release may keep them elsewhere.
func TestContainerfileBasesArePinned(t *testing.T) {
	cf := parseContainerfile(t, "../../Containerfile")
	gomod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if goVersion == nil {
		t.Fatal("go.mod has no go line")
	}
	goImage := regexp.MustCompile(`^docker\.io/library/golang:(\d+\.\d+)\.\d+-bookworm@sha256:[0-9a-f]{64}$`)
	if m := goImage.FindStringSubmatch(cf.args["GO_IMAGE"]); m == nil {
		t.Errorf("ARG GO_IMAGE=%q is not golang:X.Y.Z-bookworm pinned by digest", cf.args["GO_IMAGE"])
	} else if m[1] != string(goVersion[1]) {
		t.Errorf("ARG GO_IMAGE is Go %s, go.mod says go %s", m[1], goVersion[1])
	}
	baseImage := regexp.MustCompile(`^docker\.io/library/debian:bookworm-\d{8}-slim@sha256:[0-9a-f]{64}$`)
	if !baseImage.MatchString(cf.args["BASE_IMAGE"]) {
		t.Errorf("ARG BASE_IMAGE=%q is not debian:bookworm-DATE-slim pinned by digest", cf.args["BASE_IMAGE"])
	}
	if first := cf.stages[0]; first.from != "${GO_IMAGE}" || first.name != "build" {
		t.Errorf("first stage FROM %s AS %s, want FROM ${GO_IMAGE} AS build", first.from, first.name)
	}
	if last := cf.stages[len(cf.stages)-1]; last.from != "${BASE_IMAGE}" {
		t.Errorf("final stage FROM %s, want FROM ${BASE_IMAGE}", last.from)
	}
}

// The build stage runs `make build` and the image holds each binary it
// builds at the path BerthSpec gives it.
func TestContainerfileCopiesWhatMakeBuildBuilds(t *testing.T) {
	cf := parseContainerfile(t, "../../Containerfile")
	build := cf.stages[0]
	runs := strings.Join(build.all("RUN"), "\n")
	if !strings.Contains(runs, "make build ") {
		t.Error("the build stage does not run make build")
	}
	if !slices.Contains(installed(runs), "--ceph-build") {
		t.Error("the build stage does not run hack/install-deps.sh --ceph-build, as make build does")
	}

	// BerthSpec's paths of the binaries make build writes.
	dir := t.TempDir()
	built := regexp.MustCompile(`-o \$\(BIN\)/(\S+)`).FindAllStringSubmatch(recipe(t, "build"), -1)
	if len(built) == 0 {
		t.Fatal("make build writes no -o $(BIN)/NAME")
	}
	for _, m := range built {
		if err := os.WriteFile(filepath.Join(dir, m[1]), []byte("stand-in"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var want []string
	for _, f := range berthBinaries(filepath.Join(dir, "berth")) {
		want = append(want, f.Path)
	}
	if len(want) != len(built) {
		t.Errorf("make build writes %d binaries, BerthSpec takes %d (%v)", len(built), len(want), want)
	}

	var got []string
	for _, args := range cf.stages[len(cf.stages)-1].all("COPY") {
		f := strings.Fields(args)
		if len(f) < 3 || f[0] != "--from="+build.name {
			continue
		}
		dest := f[len(f)-1]
		for _, src := range f[1 : len(f)-1] {
			if path.Base(path.Dir(src)) != "bin" {
				t.Errorf("COPY %s: not from make build's bin/", src)
			}
			got = append(got, path.Join(dest, path.Base(src)))
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("the Containerfile copies %v from the build stage, BerthSpec has %v", got, want)
	}
}

// The final stage installs a package for every tool BerthSpec takes, and
// for every other file of it from a package, and at least what `make image`
// installs; it makes the link and folder that no package ships.
func TestContainerfileInstallsBerthTools(t *testing.T) {
	cf := parseContainerfile(t, "../../Containerfile")
	final := cf.stages[len(cf.stages)-1]
	runs := strings.Join(final.all("RUN"), "\n")
	pkgs := installed(runs)
	if len(pkgs) == 0 {
		t.Fatal("the final stage installs no packages through hack/install-deps.sh")
	}
	required, optional := BerthTools()
	for _, tool := range append(required, optional...) {
		pkg, ok := toolPackages[tool]
		if !ok {
			t.Errorf("BerthTools has %s: add its Debian package to toolPackages", tool)
			continue
		}
		if !slices.Contains(pkgs, pkg) {
			t.Errorf("the Containerfile does not install %s (for %s)", pkg, tool)
		}
	}
	for file, pkg := range filePackages {
		if !slices.Contains(pkgs, pkg) {
			t.Errorf("the Containerfile does not install %s (for %s)", pkg, file)
		}
	}
	for _, pkg := range installed(recipe(t, "image")) {
		if !slices.Contains(pkgs, pkg) {
			t.Errorf("make image installs %s, the Containerfile does not", pkg)
		}
	}
	for _, f := range ganeshaEntries {
		cmd := fmt.Sprintf("ln -sfn %s %s", f.Link, f.Path)
		if f.Dir {
			cmd = fmt.Sprintf("install -d -m %#o %s", f.Mode.Perm(), f.Path)
		}
		if !strings.Contains(runs, cmd) {
			t.Errorf("the final stage does not run %q", cmd)
		}
	}
}

// The image starts berth the way make image's does, with the same PATH.
func TestContainerfileEntrypoint(t *testing.T) {
	cf := parseContainerfile(t, "../../Containerfile")
	final := cf.stages[len(cf.stages)-1]
	eps := final.all("ENTRYPOINT")
	if len(eps) != 1 {
		t.Fatalf("the final stage has %d ENTRYPOINTs, want 1", len(eps))
	}
	var ep []string
	if err := json.Unmarshal([]byte(eps[0]), &ep); err != nil {
		t.Fatalf("ENTRYPOINT %s: not the exec (JSON) form: %v", eps[0], err)
	}
	if want := []string{berthEntrypoint}; !slices.Equal(ep, want) {
		t.Errorf("ENTRYPOINT %v, make image has %v", ep, want)
	}
	if !slices.Contains(final.all("ENV"), imagePath) {
		t.Errorf("the final stage does not set ENV %s", imagePath)
	}
}

// The package tables name the packages that ship each tool and file here,
// where dpkg knows them. dpkg knows a file by the path its package ships
// it at: on a merged-/usr machine /usr/sbin/losetup is mount's /sbin/losetup.
func TestDebianPackagesMatchDpkg(t *testing.T) {
	if _, err := exec.LookPath("dpkg-query"); err != nil {
		t.Skip("needs dpkg (Debian)")
	}
	files := map[string]string{}
	for tool, pkg := range toolPackages {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Logf("%s is not installed here: not checked", tool)
			continue
		}
		abs, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		files[abs] = pkg
	}
	for file, pkg := range filePackages {
		if _, err := os.Stat(file); err != nil {
			t.Logf("%s is not here: not checked", file)
			continue
		}
		files[file] = pkg
	}
	for file, want := range files {
		var owners []string
		for _, p := range []string{file, unmerged(file)} {
			out, err := exec.Command("dpkg-query", "-S", p).Output()
			if err != nil {
				continue
			}
			owners = append(owners, dpkgOwners(string(out))...)
		}
		if !slices.Contains(owners, want) {
			t.Errorf("%s: the table says %s, dpkg says %v", file, want, owners)
		}
	}
}

// unmerged is p's path before merged /usr: /usr/sbin/x is /sbin/x.
func unmerged(p string) string {
	for _, d := range []string{"/usr/bin/", "/usr/sbin/", "/usr/lib/"} {
		if rest, ok := strings.CutPrefix(p, d); ok {
			return strings.TrimPrefix(d, "/usr") + rest
		}
	}
	return p
}

// dpkgOwners reads `dpkg-query -S` lines such as
//
//	librbd1:amd64: /usr/lib/x86_64-linux-gnu/librbd.so.1
//	e2fsprogs, util-linux: /sbin/fsck
func dpkgOwners(out string) []string {
	var pkgs []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "diversion ") {
			continue
		}
		owners, _, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		for _, o := range strings.Split(owners, ", ") {
			name, _, _ := strings.Cut(o, ":")
			pkgs = append(pkgs, name)
		}
	}
	return pkgs
}
