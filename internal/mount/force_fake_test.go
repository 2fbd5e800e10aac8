package mount

import (
	"errors"
	"slices"
	"testing"

	"github.com/go-logr/logr/testr"
	mountutils "k8s.io/mount-utils"
)

// lazyFake is mount-utils' FakeMounter plus the lazy unmount force cleanup
// falls back to.
type lazyFake struct {
	*mountutils.FakeMounter
	lazy []string
}

func (l *lazyFake) UnmountLazy(target string) error {
	l.lazy = append(l.lazy, target)
	l.UnmountFunc = nil // a lazy detach succeeds while the mount is busy
	return l.Unmount(target)
}

// TestFakeForceUnmountDevice: a busy staging mount is detached lazily
// through the mounter; a mounter without lazy unmount reports the busy
// mount instead of touching the kernel.
func TestFakeForceUnmountDevice(t *testing.T) {
	for _, lazy := range []bool{true, false} {
		f := newFakeEnv(t, unformatted(t)...)
		var m mountutils.Interface = f.mounter
		lf := &lazyFake{FakeMounter: f.mounter}
		if lazy {
			m = lf
		}
		mi, op, blank := f.mgr.mountInfo, f.mgr.openers, f.mgr.blank
		f.mgr = NewManager(m, f.exec, testr.New(t))
		f.mgr.mountInfo, f.mgr.openers, f.mgr.blank = mi, op, blank
		f.mgr.devNumber = func(dev string) (int, int, bool, error) { return 7, 0, dev == "/dev/loop7", nil }

		staging := f.path("staging")
		if err := f.mgr.Stage(t.Context(), StageRequest{VolumeID: "v", Device: "/dev/loop7", StagingPath: staging}); err != nil {
			t.Fatal(err)
		}
		busy := errors.New("target is busy")
		f.mounter.UnmountFunc = func(string) error { return busy }

		done, err := f.mgr.ForceUnmountDevice(t.Context(), "/dev/loop7")
		if !lazy {
			if !errors.Is(err, busy) || len(done) != 0 || f.mounts() != 1 {
				t.Errorf("without lazy unmount: done %v, err %v, %d mounts; want the busy error and the mount kept", done, err, f.mounts())
			}
			continue
		}
		if err != nil || !slices.Equal(done, []string{staging}) || !slices.Equal(lf.lazy, []string{staging}) || f.mounts() != 0 {
			t.Errorf("lazy: done %v, err %v, lazy calls %v, %d mounts; want %s detached lazily", done, err, lf.lazy, f.mounts(), staging)
		}
		if done, err := f.mgr.ForceUnmountDevice(t.Context(), "/dev/loop9"); err != nil || len(done) != 0 {
			t.Errorf("device without a node: %v %v, want nothing done", done, err)
		}
	}
}
