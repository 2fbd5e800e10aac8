package mount

import (
	"errors"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	testingexec "k8s.io/utils/exec/testing"

	"github.com/berth-io/berth/internal/volerr"
)

func isErr(err, target error) bool { return errors.Is(err, target) }

// fakeLoopKernel is loop devices and files as a table. A device or file
// marked stalled blocks until release is closed, as one over a FUSE file
// whose server is gone.
type fakeLoopKernel struct {
	bound   []boundLoop
	devs    map[string]fakeStat // Status by device
	files   map[string]fakeStat // Identify by path
	release chan struct{}

	mu    sync.Mutex
	asked map[string]int
}

type fakeStat struct {
	name    string
	id      fileID
	err     error
	stalled bool
}

func (k *fakeLoopKernel) Bound() ([]boundLoop, error) { return k.bound, nil }

func (k *fakeLoopKernel) ask(key string, s fakeStat, ok bool) (fakeStat, error) {
	k.mu.Lock()
	if k.asked == nil {
		k.asked = map[string]int{}
	}
	k.asked[key]++
	k.mu.Unlock()
	if !ok {
		return s, unix.ENOENT
	}
	if s.stalled {
		<-k.release
	}
	return s, s.err
}

func (k *fakeLoopKernel) Status(dev string) (fileID, error) {
	s, ok := k.devs[dev]
	s, err := k.ask(dev, s, ok)
	return s.id, err
}

func (k *fakeLoopKernel) Identify(file string) (string, fileID, error) {
	s, ok := k.files[file]
	s, err := k.ask(file, s, ok)
	if s.name == "" {
		s.name = file
	}
	return s.name, s.id, err
}

func (k *fakeLoopKernel) times(key string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.asked[key]
}

var (
	imgID   = fileID{Major: 254, Minor: 0, Ino: 12}
	otherID = fileID{Major: 0, Minor: 61, Ino: 12}
)

// newFakeLoop is a Loop over k whose lookups give up after timeout.
func newFakeLoop(t *testing.T, k *fakeLoopKernel, timeout time.Duration, script ...testingexec.FakeCommandAction) (*losetup, *testingexec.FakeExec) {
	if k.release == nil {
		k.release = make(chan struct{})
		t.Cleanup(func() { close(k.release) })
	}
	fe := &testingexec.FakeExec{CommandScript: script}
	return newLoop(NewTools(fe, Timeouts{Loop: timeout}), k), fe
}

func TestLoopAttachReusesExisting(t *testing.T) {
	k := &fakeLoopKernel{
		bound: []boundLoop{{Dev: "/dev/loop3", Backing: "/img"}},
		devs:  map[string]fakeStat{"/dev/loop3": {id: imgID}},
		files: map[string]fakeStat{"/img": {id: imgID}},
	}
	l, fe := newFakeLoop(t, k, time.Minute)
	dev, err := l.Attach(t.Context(), "/img", false)
	if err != nil || dev != "/dev/loop3" || fe.CommandCalls != 0 {
		t.Fatalf("got %q %v after %d commands", dev, err, fe.CommandCalls)
	}
}

func TestLoopAttachNew(t *testing.T) {
	k := &fakeLoopKernel{files: map[string]fakeStat{"/img": {id: imgID}}}
	l, _ := newFakeLoop(t, k, time.Minute,
		cmd(t, "losetup", []string{"--find", "--show", "--direct-io=on", "--read-only", "/img"},
			"losetup: /img: failed to set direct io\n/dev/loop4\n", nil))
	dev, err := l.Attach(t.Context(), "/img", true)
	if err != nil || dev != "/dev/loop4" {
		t.Fatalf("got %q %v", dev, err)
	}
}

func TestLoopAttachModeMismatch(t *testing.T) {
	k := &fakeLoopKernel{
		bound: []boundLoop{{Dev: "/dev/loop3", Backing: "/img", ReadOnly: true}},
		devs:  map[string]fakeStat{"/dev/loop3": {id: imgID}},
		files: map[string]fakeStat{"/img": {id: imgID}},
	}
	l, _ := newFakeLoop(t, k, time.Minute)
	if _, err := l.Attach(t.Context(), "/img", false); !isErr(err, ErrExists) {
		t.Fatalf("read-only device for a writer: want ErrExists, got %v", err)
	}
}

// Devices are matched by identity among those whose path may be the
// file's; the kernel's name for the file is what paths are compared with.
func TestLoopFindByIdentity(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bound []boundLoop
		devs  map[string]fakeStat
		file  fakeStat
		want  string
	}{{
		name:  "same path, another namespace's file",
		bound: []boundLoop{{Dev: "/dev/loop1", Backing: "/r/v/disk.img"}},
		devs:  map[string]fakeStat{"/dev/loop1": {id: otherID}},
		file:  fakeStat{id: imgID},
	}, {
		name:  "same path, ours after another namespace's",
		bound: []boundLoop{{Dev: "/dev/loop1", Backing: "/r/v/disk.img"}, {Dev: "/dev/loop2", Backing: "/r/v/disk.img"}},
		devs:  map[string]fakeStat{"/dev/loop1": {id: otherID}, "/dev/loop2": {id: imgID}},
		file:  fakeStat{id: imgID},
		want:  "/dev/loop2",
	}, {
		name:  "attached in a namespace that is gone: a tail of the path",
		bound: []boundLoop{{Dev: "/dev/loop4", Backing: "/disk.img"}},
		devs:  map[string]fakeStat{"/dev/loop4": {id: imgID}},
		file:  fakeStat{id: imgID},
		want:  "/dev/loop4",
	}, {
		name:  "a tail inside a name is another file",
		bound: []boundLoop{{Dev: "/dev/loop4", Backing: "/isk.img"}},
		devs:  map[string]fakeStat{"/dev/loop4": {id: imgID}},
		file:  fakeStat{name: "/r/v/disk.img", id: imgID},
	}, {
		name:  "through a symbolic link: the kernel's name",
		bound: []boundLoop{{Dev: "/dev/loop5", Backing: "/real/disk.img"}},
		devs:  map[string]fakeStat{"/dev/loop5": {id: imgID}},
		file:  fakeStat{name: "/real/disk.img", id: imgID},
		want:  "/dev/loop5",
	}, {
		name:  "our connection ended: the one unreadable device of the path",
		bound: []boundLoop{{Dev: "/dev/loop1", Backing: "/r/v/disk.img"}, {Dev: "/dev/loop2", Backing: "/r/v/disk.img"}},
		devs:  map[string]fakeStat{"/dev/loop1": {id: otherID}, "/dev/loop2": {err: unix.ENOTCONN}},
		file:  fakeStat{err: unix.ENOTCONN},
		want:  "/dev/loop2",
	}, {
		name:  "no file here: nothing of its path elsewhere",
		bound: []boundLoop{{Dev: "/dev/loop1", Backing: "/r/v/disk.img"}},
		devs:  map[string]fakeStat{"/dev/loop1": {err: unix.ENOTCONN}},
		file:  fakeStat{err: unix.ENOENT},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			k := &fakeLoopKernel{bound: tc.bound, devs: tc.devs, files: map[string]fakeStat{"/r/v/disk.img": tc.file}}
			l, _ := newFakeLoop(t, k, time.Minute)
			dev, found, err := l.Find(t.Context(), "/r/v/disk.img")
			if err != nil || dev != tc.want || found != (tc.want != "") {
				t.Fatalf("got %q %v %v, want %q", dev, found, err, tc.want)
			}
		})
	}
}

// A device over a stalled file is never asked about another file, and a
// lookup of its own path gives up with ErrToolTimeout; lookups that wait
// for the same device share one call.
func TestLoopFindPastStalledDevice(t *testing.T) {
	k := &fakeLoopKernel{
		bound: []boundLoop{{Dev: "/dev/loop1", Backing: "/fuse/a/disk.img"}, {Dev: "/dev/loop2", Backing: "/img"}},
		devs:  map[string]fakeStat{"/dev/loop1": {stalled: true}, "/dev/loop2": {id: imgID}},
		files: map[string]fakeStat{"/img": {id: imgID}, "/fuse/a/disk.img": {id: otherID}},
	}
	l, _ := newFakeLoop(t, k, 50*time.Millisecond)
	if dev, found, err := l.Find(t.Context(), "/img"); dev != "/dev/loop2" || !found || err != nil {
		t.Fatalf("got %q %v %v", dev, found, err)
	}
	if n := k.times("/dev/loop1"); n != 0 {
		t.Fatalf("the stalled device was asked %d times about another file", n)
	}
	for range 3 {
		if _, _, err := l.Find(t.Context(), "/fuse/a/disk.img"); !isErr(err, ErrToolTimeout) {
			t.Fatalf("stalled device of the path: want ErrToolTimeout, got %v", err)
		}
	}
	if n := k.times("/dev/loop1"); n != 1 {
		t.Fatalf("the stalled device was asked %d times, want once", n)
	}
}

func TestLoopDetachIdempotent(t *testing.T) {
	fe := &testingexec.FakeExec{CommandScript: []testingexec.FakeCommandAction{
		cmd(t, "losetup", []string{"--detach", "/dev/loop3"}, "losetup: /dev/loop3: detach failed: No such device or address\n", &testingexec.FakeExitError{Status: 1}),
		cmd(t, "losetup", []string{"--detach", "/dev/loop3"}, "losetup: /dev/loop3: detach failed: Permission denied\n", &testingexec.FakeExitError{Status: 1}),
	}}
	l := NewLoop(fe)
	if err := l.Detach(t.Context(), "/dev/loop3"); err != nil {
		t.Fatalf("free device: %v", err)
	}
	if err := l.Detach(t.Context(), "/dev/loop3"); err == nil {
		t.Fatal("real failure hidden")
	}
	if err := l.Detach(t.Context(), ""); !isErr(err, volerr.ErrInvalid) {
		t.Fatalf("empty: %v", err)
	}
}
