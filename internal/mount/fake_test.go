package mount

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"
	mountutils "k8s.io/mount-utils"
	"k8s.io/utils/exec"
	testingexec "k8s.io/utils/exec/testing"

	"github.com/berth-io/berth/internal/volerr"
)

// fakeEnv is a Manager over mount-utils' FakeMounter with a mountinfo view
// derived from it the way the kernel would show it.
type fakeEnv struct {
	dir     string
	mounter *mountutils.FakeMounter
	exec    *testingexec.FakeExec
	mgr     *Manager
	openers []int
}

func newFakeEnv(t *testing.T, script ...testingexec.FakeCommandAction) *fakeEnv {
	t.Helper()
	f := &fakeEnv{
		dir:     t.TempDir(),
		mounter: mountutils.NewFakeMounter(nil),
		exec:    &testingexec.FakeExec{CommandScript: script},
	}
	f.mgr = NewManager(f.mounter, f.exec, testr.New(t))
	f.mgr.mountInfo = f.mountInfo
	f.mgr.openers = func(string) ([]int, error) { return f.openers, nil }
	f.mgr.blank = func(context.Context, string, string) error { return nil } // /dev/loop7 is not real
	return f
}

// mountInfo mimics the kernel: filesystem mounts (and binds of them) carry
// the block device's number; binds of a device node carry devtmpfs's number
// and the node's name as root.
func (f *fakeEnv) mountInfo() ([]mountutils.MountInfo, error) {
	mps, _ := f.mounter.List()
	out := []mountutils.MountInfo{{Major: 0, Minor: 5, Root: "/", MountPoint: "/dev", Source: "devtmpfs", FsType: "devtmpfs"}}
	var devs []string
	for _, mp := range mps {
		opts := []string{"rw"}
		if slices.Contains(mp.Opts, "ro") {
			opts = []string{"ro"}
		}
		mi := mountutils.MountInfo{MountPoint: mp.Path, Source: mp.Device, FsType: mp.Type, MountOptions: opts, SuperOptions: []string{"rw"}}
		if fi, err := os.Stat(mp.Path); err == nil && !fi.IsDir() {
			mi.Major, mi.Minor, mi.Root = 0, 5, "/"+filepath.Base(mp.Device)
		} else {
			if !slices.Contains(devs, mp.Device) {
				devs = append(devs, mp.Device)
			}
			mi.Major, mi.Minor, mi.Root = 7, slices.Index(devs, mp.Device), "/"
		}
		out = append(out, mi)
	}
	return out, nil
}

func (f *fakeEnv) path(name string) string { return filepath.Join(f.dir, name) }

func (f *fakeEnv) mounts() int {
	mps, _ := f.mounter.List()
	return len(mps)
}

// cmd scripts one command: it checks the name and the arguments it must
// contain, and answers out with err.
func cmd(t *testing.T, name string, want []string, out string, err error) testingexec.FakeCommandAction {
	return func(c string, args ...string) exec.Cmd {
		if c != name {
			t.Errorf("ran %s %v, want %s", c, args, name)
		}
		for _, w := range want {
			if !slices.Contains(args, w) {
				t.Errorf("%s %v lacks %q", c, args, w)
			}
		}
		fc := &testingexec.FakeCmd{CombinedOutputScript: []testingexec.FakeAction{
			func() ([]byte, []byte, error) { return []byte(out), nil, err },
		}}
		return testingexec.InitFakeCmd(fc, c, args...)
	}
}

// unformatted scripts a blank device: Stage's own probe and mount-utils'
// both find nothing, then mkfs runs.
func unformatted(t *testing.T) []testingexec.FakeCommandAction {
	return []testingexec.FakeCommandAction{
		cmd(t, "blkid", nil, "", &testingexec.FakeExitError{Status: 2}),
		cmd(t, "blkid", nil, "", &testingexec.FakeExitError{Status: 2}),
		cmd(t, "mkfs.ext4", []string{"/dev/loop7"}, "", nil),
	}
}

func TestFakeStageIdempotent(t *testing.T) {
	f := newFakeEnv(t, unformatted(t)...)
	staging := f.path("staging")
	req := StageRequest{VolumeID: "v", Device: "/dev/loop7", StagingPath: staging}
	for range 2 {
		if err := f.mgr.Stage(t.Context(), req); err != nil {
			t.Fatal(err)
		}
	}
	if f.exec.CommandCalls != 3 || f.mounts() != 1 {
		t.Fatalf("%d commands, %d mounts; want blkid twice and mkfs once, and one mount", f.exec.CommandCalls, f.mounts())
	}
	req.Device = "/dev/loop8"
	if err := f.mgr.Stage(t.Context(), req); !isErr(err, ErrExists) {
		t.Fatalf("other device: want ErrExists, got %v", err)
	}
	if err := f.mgr.Stage(t.Context(), StageRequest{Device: "/dev/loop7", StagingPath: staging, Block: true}); !isErr(err, ErrExists) {
		t.Fatalf("block over filesystem staging: want ErrExists, got %v", err)
	}
	if dev, block, err := f.mgr.StagedDevice(t.Context(), staging); dev != "/dev/loop7" || block || err != nil {
		t.Fatalf("staged device %q %t %v", dev, block, err)
	}
}

func TestFakeStageRejectsBadInput(t *testing.T) {
	f := newFakeEnv(t)
	for _, r := range []StageRequest{
		{Device: "/dev/loop7", StagingPath: "relative"},
		{Device: "", StagingPath: f.path("s")},
		{Device: "/dev/loop7", StagingPath: f.path("s"), FSType: "ntfs"},
	} {
		if err := f.mgr.Stage(t.Context(), r); !isErr(err, volerr.ErrInvalid) {
			t.Errorf("%+v: want volerr.ErrInvalid, got %v", r, err)
		}
	}
	file := f.path("file")
	_ = os.WriteFile(file, nil, 0o600)
	f.exec.CommandScript = unformatted(t)[:1]
	if err := f.mgr.Stage(t.Context(), StageRequest{Device: "/dev/loop7", StagingPath: file}); !isErr(err, volerr.ErrInvalid) {
		t.Errorf("file as staging dir: want volerr.ErrInvalid, got %v", err)
	}
	if f.mounts() != 0 || f.exec.CommandCalls != 0 {
		t.Fatalf("bad input changed things: %d mounts, %d commands", f.mounts(), f.exec.CommandCalls)
	}
}

func TestFakePublishWrongTargetType(t *testing.T) {
	f := newFakeEnv(t, unformatted(t)...)
	staging := f.path("staging")
	if err := f.mgr.Stage(t.Context(), StageRequest{Device: "/dev/loop7", StagingPath: staging}); err != nil {
		t.Fatal(err)
	}
	file, dir := f.path("file"), f.path("dir")
	_ = os.WriteFile(file, []byte("keep"), 0o600)
	_ = os.Mkdir(dir, 0o700)
	if err := f.mgr.Publish(t.Context(), PublishRequest{StagingPath: staging, TargetPath: file}); !isErr(err, volerr.ErrInvalid) {
		t.Fatalf("file for filesystem: want volerr.ErrInvalid, got %v", err)
	}
	if err := f.mgr.Publish(t.Context(), PublishRequest{TargetPath: dir, Device: "/dev/loop7", Block: true}); !isErr(err, volerr.ErrInvalid) {
		t.Fatalf("dir for block: want volerr.ErrInvalid, got %v", err)
	}
	if got, _ := os.ReadFile(file); string(got) != "keep" || f.mounts() != 1 {
		t.Fatalf("refused publish changed things: %q, %d mounts", got, f.mounts())
	}
	if err := f.mgr.Publish(t.Context(), PublishRequest{StagingPath: f.path("nostage"), TargetPath: f.path("t")}); !isErr(err, ErrNotStaged) {
		t.Fatalf("unstaged: want ErrNotStaged, got %v", err)
	}
}

func TestFakeUnstageRefusedWhileRefs(t *testing.T) {
	f := newFakeEnv(t, unformatted(t)...)
	staging, target := f.path("staging"), f.path("pod/mount")
	if err := f.mgr.Stage(t.Context(), StageRequest{Device: "/dev/loop7", StagingPath: staging}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := f.mgr.Publish(t.Context(), PublishRequest{StagingPath: staging, TargetPath: target}); err != nil {
			t.Fatal(err)
		}
	}
	if f.mounts() != 2 {
		t.Fatalf("%d mounts after publishing twice", f.mounts())
	}
	if _, err := f.mgr.Unstage(t.Context(), staging); !isErr(err, ErrInUse) || f.mounts() != 2 {
		t.Fatalf("with a pod: want ErrInUse and no change, got %v, %d mounts", err, f.mounts())
	}
	for range 2 {
		if err := f.mgr.Unpublish(t.Context(), target); err != nil {
			t.Fatal(err)
		}
	}
	f.openers = []int{42}
	if _, err := f.mgr.Unstage(t.Context(), staging); !isErr(err, ErrInUse) || !strings.Contains(err.Error(), "42") {
		t.Fatalf("open handle: want ErrInUse naming pid 42, got %v", err)
	}
	f.openers = nil
	if dev, err := f.mgr.Unstage(t.Context(), staging); dev != "/dev/loop7" || err != nil {
		t.Fatalf("unstage: %q %v", dev, err)
	}
	if dev, err := f.mgr.Unstage(t.Context(), staging); dev != "" || err != nil {
		t.Fatalf("second unstage: %q %v", dev, err)
	}
	if _, err := os.Stat(staging); !os.IsNotExist(err) {
		t.Fatalf("staging dir left: %v", err)
	}
}

func TestFakeBlockStagePublish(t *testing.T) {
	f := newFakeEnv(t)
	staging, target := f.path("staging"), f.path("pod/dev")
	for range 2 {
		if err := f.mgr.Stage(t.Context(), StageRequest{Device: "/dev/loop7", StagingPath: staging, Block: true}); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.mgr.Stage(t.Context(), StageRequest{Device: "/dev/loop8", StagingPath: staging, Block: true}); !isErr(err, ErrExists) {
		t.Fatalf("other device: want ErrExists, got %v", err)
	}
	for range 2 {
		if err := f.mgr.Publish(t.Context(), PublishRequest{StagingPath: staging, TargetPath: target, Block: true}); err != nil {
			t.Fatal(err)
		}
	}
	if f.mounts() != 2 || f.exec.CommandCalls != 0 {
		t.Fatalf("%d mounts, %d commands", f.mounts(), f.exec.CommandCalls)
	}
	if _, err := f.mgr.Unstage(t.Context(), staging); !isErr(err, ErrInUse) {
		t.Fatalf("with a pod: want ErrInUse, got %v", err)
	}
	if err := f.mgr.Unpublish(t.Context(), target); err != nil {
		t.Fatal(err)
	}
	if dev, err := f.mgr.Unstage(t.Context(), staging); dev != "/dev/loop7" || err != nil {
		t.Fatalf("unstage: %q %v", dev, err)
	}
}

func TestFakeCondition(t *testing.T) {
	f := newFakeEnv(t)
	if abnormal, msg := f.mgr.Condition(t.Context(), f.path("staging")); !abnormal || !strings.Contains(msg, "nothing mounted") {
		t.Fatalf("unstaged: %t %q", abnormal, msg)
	}
	staging := f.path("staging")
	_ = os.Mkdir(staging, 0o700)
	f.mgr.mountInfo = func() ([]mountutils.MountInfo, error) {
		return []mountutils.MountInfo{{Major: 7, Minor: 1, Root: "/", MountPoint: staging, Source: "/dev/null",
			MountOptions: []string{"rw"}, SuperOptions: []string{"ro", "errors=remount-ro"}}}, nil
	}
	if abnormal, msg := f.mgr.Condition(t.Context(), staging); !abnormal || !strings.Contains(msg, "read-only") {
		t.Fatalf("remounted ro: %t %q", abnormal, msg)
	}
}

func TestUnescapeOctal(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", `/plain`: "/plain", `/x\134y`: `/x\y`, `/end\04`: `/end\04`} {
		if got := unescapeOctal(in); got != want {
			t.Errorf("%q: got %q want %q", in, got, want)
		}
	}
}
