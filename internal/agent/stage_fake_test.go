package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mountutils "k8s.io/mount-utils"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/exec"
	testingexec "k8s.io/utils/exec/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/mount"
)

// Unit tests of Stage's rollback with fakes (mount-utils' FakeMounter, a
// scripted exec, in-memory loop devices and fence); the same paths run for
// real in test/sanity and test/flexvolume, and the rollback after a real
// mkfs or mount failure in test/userspace (TestStageRollbackLeavesNothing).

type fakeImages struct {
	path string
	// formatted is the image's format record; nil: none.
	formatted *backend.FormatRecord
	// gone: no image (Get says backend.ErrNotFound).
	gone bool
}

func (f fakeImages) Get(_ context.Context, id string) (backend.Image, error) {
	if f.gone {
		return backend.Image{}, fmt.Errorf("volume %s: %w", id, backend.ErrNotFound)
	}
	return backend.Image{ID: id, Path: f.path, Size: 64 << 20}, nil
}

func (f fakeImages) Format(context.Context, string) (backend.FormatRecord, bool, error) {
	if f.formatted == nil || f.formatted.FSType == "" {
		return backend.FormatRecord{}, false, nil
	}
	return *f.formatted, true, nil
}

// RecordFormat keeps the first record, in formatted (when not nil).
func (f fakeImages) RecordFormat(_ context.Context, _, fsType string, at time.Time) error {
	if f.formatted != nil && f.formatted.FSType == "" {
		*f.formatted = backend.FormatRecord{FSType: fsType, Time: at}
	}
	return nil
}

// fakeLoop keeps loop devices in memory: backing file -> device. The one
// device is a plain file, read by stage's blank check.
type fakeLoop struct {
	devs map[string]string
	dev  string
}

func (l *fakeLoop) Attach(_ context.Context, backing string, _ bool) (string, error) {
	if dev, ok := l.devs[backing]; ok {
		return dev, nil
	}
	dev := l.dev
	l.devs[backing] = dev
	return dev, nil
}

func (l *fakeLoop) Find(_ context.Context, backing string) (string, bool, error) {
	dev, ok := l.devs[backing]
	return dev, ok, nil
}

func (l *fakeLoop) Detach(_ context.Context, dev string) error {
	for b, d := range l.devs {
		if d == dev {
			delete(l.devs, b)
		}
	}
	return nil
}

func (l *fakeLoop) Refresh(context.Context, string) error { return nil }

func (l *fakeLoop) BackingName(dev string) (string, bool, error) {
	for b, d := range l.devs {
		if d == dev {
			return b, true, nil
		}
	}
	return "", false, nil
}

// fakeFence records holds by volume and mount dir, and the requests.
type fakeFence struct {
	mu         sync.Mutex // for tests that run requests side by side
	holds      map[string]bool
	requests   []fence.Request
	acquireErr error
}

func (f *fakeFence) Acquire(_ context.Context, r fence.Request) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, r)
	if f.acquireErr != nil {
		return f.acquireErr
	}
	f.holds[r.Volume+" "+r.MountDir] = true
	return nil
}

func (f *fakeFence) Release(_ context.Context, volume, _, mountDir string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.holds, volume+" "+mountDir)
	return nil
}

// held tells whether "volume mountDir" is held, while requests may run.
func (f *fakeFence) held(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.holds[key]
}

func (f *fakeFence) ReportStaged(context.Context, string, fence.Staged) error { return nil }

// failingMounter is a FakeMounter whose mounts fail.
type failingMounter struct{ *mountutils.FakeMounter }

func (failingMounter) MountSensitive(string, string, string, []string, []string) error {
	return errors.New("mount: wrong fs type, bad superblock")
}

type stageEnv struct {
	agent *Agent
	// cfg made agent: a test that needs more of the agent changes it
	// and makes the agent again.
	cfg     Config
	images  fakeImages
	loop    *fakeLoop
	fence   *fakeFence
	mounter *mountutils.FakeMounter
	exec    *testingexec.FakeExec
	api     client.Client
	staging string
}

func newStageEnv(t *testing.T, failMount bool, script ...testingexec.FakeCommandAction) *stageEnv {
	return newStageEnvOf(t, failMount, func(*v1.Volume) {}, script...)
}

// newStageEnvOf is newStageEnv with a Volume that edit changed. The image
// and the loop device are sparse files of zeros: a blank volume.
func newStageEnvOf(t *testing.T, failMount bool, edit func(*v1.Volume), script ...testingexec.FakeCommandAction) *stageEnv {
	t.Helper()
	vol := &v1.Volume{
		ObjectMeta: metav1.ObjectMeta{Name: "vol-a"},
		Spec: v1.VolumeSpec{StorageCluster: "c", Size: resource.MustParse("64Mi"), AccessMode: v1.ReadWriteOnce,
			FSType: "ext4", Node: "node-a"},
	}
	edit(vol)
	dir := t.TempDir()
	image, dev := filepath.Join(dir, "vol-a.img"), filepath.Join(dir, "loop7")
	for _, f := range []string{image, dev} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(f, 4<<20); err != nil {
			t.Fatal(err)
		}
	}
	e := &stageEnv{
		images:  fakeImages{path: image, formatted: &backend.FormatRecord{}},
		loop:    &fakeLoop{devs: map[string]string{}, dev: dev},
		fence:   &fakeFence{holds: map[string]bool{}},
		mounter: mountutils.NewFakeMounter(nil),
		exec:    &testingexec.FakeExec{CommandScript: script},
		staging: filepath.Join(t.TempDir(), "staging"),
	}
	var m mountutils.Interface = e.mounter
	if failMount {
		m = failingMounter{e.mounter}
	}
	e.api = fakeAPI(t, vol).WithStatusSubresource(vol).Build()
	e.cfg = Config{API: e.api, Images: e.images, Loop: e.loop, Mounts: mount.NewManager(m, e.exec, testr.New(t)),
		Fence: e.fence, Log: testr.New(t), Status: e.api, Clock: clocktesting.NewFakePassiveClock(time.Date(2026, 11, 23, 2, 0, 0, 0, time.UTC))}
	e.agent = newTestAgent(t, e.cfg)
	return e
}

func (e *stageEnv) stage(t *testing.T) error {
	t.Helper()
	return e.agent.Stage(t.Context(), StageRequest{VolumeID: "vol-a", StagingPath: e.staging})
}

// leftNothing fails unless no loop device, hold or mount is left.
func (e *stageEnv) leftNothing(t *testing.T, what string) {
	t.Helper()
	mps, _ := e.mounter.List()
	if len(e.loop.devs) != 0 || len(e.fence.holds) != 0 || len(mps) != 0 {
		t.Errorf("%s left: loop devices %v, holds %v, mounts %v", what, e.loop.devs, e.fence.holds, mps)
	}
}

// refused stages and wants it refused (with want, when not nil), after
// only the given number of commands (-1: any), leaving nothing behind.
func (e *stageEnv) refused(t *testing.T, want error, commands int) error {
	t.Helper()
	err := e.stage(t)
	if err == nil || (want != nil && !errors.Is(err, want)) {
		t.Fatalf("stage: %v, want refused (%v)", err, want)
	}
	if commands >= 0 && e.exec.CommandCalls != commands {
		t.Errorf("%d commands ran, want %d", e.exec.CommandCalls, commands)
	}
	e.leftNothing(t, "a refused stage")
	return err
}

func command(name string, err error) testingexec.FakeCommandAction {
	return func(c string, args ...string) exec.Cmd {
		if c != name {
			err = fmt.Errorf("ran %s, the script wants %s", c, name)
		}
		fc := &testingexec.FakeCmd{CombinedOutputScript: []testingexec.FakeAction{
			func() ([]byte, []byte, error) { return nil, nil, err },
		}}
		return testingexec.InitFakeCmd(fc, c, args...)
	}
}

func TestFakeStageRollback(t *testing.T) {
	blank := command("blkid", &testingexec.FakeExitError{Status: 2})
	// Stage's own probe, then mount-utils', then mkfs.
	for _, c := range []struct {
		name      string
		failMount bool
		script    []testingexec.FakeCommandAction
		edit      func(*stageEnv)
		commands  int // -1: any
	}{
		{"mkfs fails", false, []testingexec.FakeCommandAction{blank, blank, command("mkfs.ext4", &testingexec.FakeExitError{Status: 1})}, nil, 3},
		{"mount fails", true, []testingexec.FakeCommandAction{blank, blank, command("mkfs.ext4", nil)}, nil, -1},
		{"fence refuses", false, nil, func(e *stageEnv) { e.fence.acquireErr = &fence.ConflictError{} }, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newStageEnv(t, c.failMount, c.script...)
			if c.edit != nil {
				c.edit(e)
			}
			e.refused(t, nil, c.commands)
		})
	}
	t.Run("success keeps all", func(t *testing.T) {
		e := newStageEnv(t, false, blank, blank, command("mkfs.ext4", nil))
		if err := e.stage(t); err != nil {
			t.Fatal(err)
		}
		if mps, _ := e.mounter.List(); len(e.loop.devs) != 1 || len(e.fence.holds) != 1 || len(mps) != 1 {
			t.Errorf("staged: loop devices %v, holds %v, mounts %v; want one of each", e.loop.devs, e.fence.holds, mps)
		}
	})
}

// A volume of another node is refused before anything is made, naming the
// node it lives on and the pod that uses it there.
func TestFakeStageOnOtherNodeNamesHolder(t *testing.T) {
	e := newStageEnvOf(t, false, func(v *v1.Volume) { v.Spec.Node = "node-b" })
	att := &v1.Attachment{
		ObjectMeta: metav1.ObjectMeta{Name: "vol-a"},
		Spec: v1.AttachmentSpec{AccessMode: v1.ReadWriteOnce, Attachments: []v1.AttachmentEntry{
			{Node: "node-b", MountDir: "/var/lib/kubelet/plugins/stage/vol-a"},
			{Node: "node-b", PodNamespace: "shop", Pod: "db-0", PodUID: "u-1", MountDir: "/var/lib/kubelet/pods/u-1/volumes/x"},
		}},
	}
	if err := e.api.Create(t.Context(), att); err != nil {
		t.Fatal(err)
	}
	err := e.refused(t, ErrWrongNode, -1)
	for _, want := range []string{"node-b", "pod shop/db-0 (uid u-1) on node node-b"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not name %q", err, want)
		}
	}
}
