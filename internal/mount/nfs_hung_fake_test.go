package mount

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	mountutils "k8s.io/mount-utils"
	testingexec "k8s.io/utils/exec/testing"
)

// hung counts calls that block until release is closed, as an umount or a
// stat of a hard NFS mount blocks while its server is away, and the most
// that were in flight at once.
type hung struct {
	release          chan struct{}
	calls, now, most atomic.Int32
}

func newHung() *hung { return &hung{release: make(chan struct{})} }

func (h *hung) block() {
	h.calls.Add(1)
	n := h.now.Add(1)
	for {
		m := h.most.Load()
		if n <= m || h.most.CompareAndSwap(m, n) {
			break
		}
	}
	<-h.release
	h.now.Add(-1)
}

// hungMounter is mount-utils' fake whose unmounts block like umount(8)
// of a hard NFS mount whose server is gone, `umount -f` included; a lazy
// unmount (MNT_DETACH) never waits. plain counts plain unmounts.
type hungMounter struct {
	*mountutils.FakeMounter
	h     *hung
	plain *atomic.Int32
}

func (m hungMounter) Unmount(target string) error {
	m.plain.Add(1)
	m.h.block()
	return m.FakeMounter.Unmount(target)
}

func (m hungMounter) UnmountForce(target string) error {
	m.h.block()
	return fmt.Errorf("umount -f %s: device is busy", target)
}

func (m hungMounter) UnmountLazy(target string) error { return m.FakeMounter.Unmount(target) }

// callAll runs n calls of f at once and returns how many returned within
// wait.
func callAll(n int, wait time.Duration, f func() error) (returned int, errs []error) {
	var mu sync.Mutex
	done := make(chan struct{}, n)
	for range n {
		go func() {
			err := f()
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
			done <- struct{}{}
		}()
	}
	deadline := time.After(wait)
	for returned < n {
		select {
		case <-done:
			returned++
		case <-deadline:
			mu.Lock()
			defer mu.Unlock()
			return returned, errs
		}
	}
	return returned, errs
}

// TestFakeHungShareUnpublishesDoNotPileUp (F15): kubelet retries the
// unpublish of a hard NFS mount whose server is gone. Five at once (each
// bounded by its context) start one unmount between them, not five, and
// each returns by its deadline; that one unmount is `umount -f` (which
// aborts the RPCs in flight), and when even it fails the mount is
// detached lazily, so the next retry finds nothing to unmount and
// succeeds. Today's main runs a plain umount(8) per call, each stuck.
func TestFakeHungShareUnpublishesDoNotPileUp(t *testing.T) {
	h := newHung()
	f := newFakeEnv(t)
	var plain atomic.Int32
	f.mgr = NewManager(hungMounter{FakeMounter: f.mounter, h: h, plain: &plain}, f.exec, testr.New(t))
	f.mgr.mountInfo = f.mountInfo
	target := f.path("pod/mount")
	if err := f.mgr.MountNFS(t.Context(), NFSRequest{VolumeID: "v", Source: "sm.ns.svc:/v", TargetPath: target}); err != nil {
		t.Fatal(err)
	}

	returned, errs := callAll(5, 3*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		return f.mgr.Unpublish(ctx, target)
	})
	most, calls := h.most.Load(), h.calls.Load()
	close(h.release) // lets today's stuck calls end
	if returned != 5 {
		t.Errorf("%d of 5 unpublishes of a hung share returned by their deadline", returned)
	}
	if most != 1 || calls != 1 {
		t.Errorf("%d unmounts started, %d at once; want one", calls, most)
	}
	for _, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("unpublish while the unmount hangs: %v, want a deadline error", err)
		}
	}
	waitFor(t, func() bool { return f.mounts() == 0 }, "the hung mount to be detached")
	if err := f.mgr.Unpublish(t.Context(), target); err != nil {
		t.Errorf("retry after the detach: %v", err)
	}
	if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("target after the unpublish: %v", err)
	}
	if c := h.calls.Load(); c != 1 {
		t.Errorf("%d unmounts in all, want 1", c)
	}
	if n := plain.Load(); n != 0 {
		t.Errorf("%d plain unmounts of an NFS mount, want umount -f only", n)
	}
}

// TestFakeKernelUnmountForce: the kernel mounter's forced unmount is
// umount -f, bounded by the tools; nothing mounted is success.
func TestFakeKernelUnmountForce(t *testing.T) {
	fe := &testingexec.FakeExec{CommandScript: []testingexec.FakeCommandAction{
		cmd(t, "umount", []string{"-f", "/pods/a/mount"}, "", nil),
		cmd(t, "umount", []string{"-f", "/pods/b/mount"}, "umount: /pods/b/mount: not mounted.", &testingexec.FakeExitError{Status: 32}),
		cmd(t, "umount", []string{"-f", "/pods/c/mount"}, "umount.nfs4: /pods/c/mount: device is busy", &testingexec.FakeExitError{Status: 16}),
	}}
	k := kernelMounter{Interface: mountutils.NewFakeMounter(nil), tools: toolsOf(fe)}
	for _, c := range []struct {
		target string
		ok     bool
	}{{"/pods/a/mount", true}, {"/pods/b/mount", true}, {"/pods/c/mount", false}} {
		if err := k.UnmountForce(c.target); (err == nil) != c.ok {
			t.Errorf("umount -f %s: %v", c.target, err)
		}
	}
	if fe.CommandCalls != 3 {
		t.Errorf("%d commands, want 3", fe.CommandCalls)
	}
}

// TestFakeHungShareProbesDoNotPileUp (F23): the share mount's probe (a
// stat that a hard mount holds while its server is away) runs once per
// path however often it is asked: five probes at once, each bounded by its
// context, share one stat and all return by their deadline; once the
// server answers, the next probe stats again. Today's main starts one
// stat per probe, each holding a thread, and returns only when it does.
func TestFakeHungShareProbesDoNotPileUp(t *testing.T) {
	h := newHung()
	f := newFakeEnv(t)
	target := f.path("pod/mount")
	if err := f.mgr.MountNFS(t.Context(), NFSRequest{VolumeID: "v", Source: "sm.ns.svc:/v", TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	f.mgr.stat = func(p string) (os.FileInfo, error) {
		h.block()
		return os.Stat(p)
	}
	returned, errs := callAll(5, 3*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		return f.mgr.ProbeShare(ctx, target)
	})
	most, calls := h.most.Load(), h.calls.Load()
	close(h.release)
	if returned != 5 {
		t.Errorf("%d of 5 probes of a hung share returned by their deadline", returned)
	}
	if most != 1 || calls != 1 {
		t.Errorf("%d stats started, %d at once; want one", calls, most)
	}
	for _, err := range errs {
		if err == nil {
			t.Error("a probe of a hung share succeeded")
		}
	}
	waitFor(t, func() bool { return f.mgr.ProbeShare(t.Context(), target) == nil }, "a probe to succeed once the server answers")
	if err := f.mgr.ProbeShare(t.Context(), target); err != nil {
		t.Errorf("probe after the answer: %v", err)
	}
	if c := h.calls.Load(); c < 2 {
		t.Errorf("%d stats in all: the probe after the answer did not ask again", c)
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestFakeShareStats: a workload's mount of a share is known by its
// export (/<volume>) and its usage is read, on any node; while the server
// is away the reads return at their deadlines and only one waits in the
// kernel, through ShareStats and Stats alike.
func TestFakeShareStats(t *testing.T) {
	f := newFakeEnv(t)
	target := f.path("pod-mount")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	f.mgr.mountInfo = func() ([]mountutils.MountInfo, error) {
		return []mountutils.MountInfo{{Major: 0, Minor: 60, Root: "/", MountPoint: target, FsType: "nfs4",
			Source: "share-manager-vol-a.berth-system.svc:/vol-a", MountOptions: []string{"rw"}, SuperOptions: []string{"rw"}}}, nil
	}
	st, err := f.mgr.ShareStats(t.Context(), target, "vol-a")
	if err != nil || st.Block || st.TotalBytes <= 0 {
		t.Errorf("ShareStats = %+v, %v; want the filesystem's usage", st, err)
	}
	for _, c := range []struct{ path, volume string }{{target, "vol-b"}, {f.path("elsewhere"), "vol-a"}} {
		if _, err := f.mgr.ShareStats(t.Context(), c.path, c.volume); !errors.Is(err, ErrNotShareMount) {
			t.Errorf("ShareStats(%s, %s) = %v, want ErrNotShareMount", c.path, c.volume, err)
		}
	}

	h := newHung()
	f.mgr.stat = func(p string) (os.FileInfo, error) {
		h.block()
		return os.Stat(p)
	}
	returned, errs := callAll(4, 3*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		if _, err := f.mgr.Stats(ctx, target); err != nil {
			return err
		}
		_, err := f.mgr.ShareStats(ctx, target, "vol-a")
		return err
	})
	most, calls := h.most.Load(), h.calls.Load()
	close(h.release)
	if returned != 4 || most != 1 || calls != 1 {
		t.Errorf("with the server away: %d of 4 returned by their deadline, %d stats started, %d at once; want 4, 1, 1", returned, calls, most)
	}
	for _, err := range errs {
		if err == nil {
			t.Error("usage of a hung share was read")
		}
	}
}

// recordingMounter is mount-utils' fake that counts plain, forced and
// lazy unmounts.
type recordingMounter struct {
	*mountutils.FakeMounter
	plain, forced, lazy *atomic.Int32
}

func (m recordingMounter) Unmount(target string) error {
	m.plain.Add(1)
	return m.FakeMounter.Unmount(target)
}

func (m recordingMounter) UnmountForce(target string) error {
	m.forced.Add(1)
	return m.FakeMounter.Unmount(target)
}

func (m recordingMounter) UnmountLazy(target string) error {
	m.lazy.Add(1)
	return m.FakeMounter.Unmount(target)
}

// TestFakeShareUnpublishNeverForcesASharedMount: two pods of one node
// mount the same share, and the kernel gives both mounts one superblock.
// `umount -f` of the first pod's mount would abort the second pod's NFS
// requests in flight (its application got EIO on the VM node: a reader
// that came while a writer left). The first is only detached; the last
// mount of the superblock is forced.
func TestFakeShareUnpublishNeverForcesASharedMount(t *testing.T) {
	f := newFakeEnv(t)
	var plain, forced, lazy atomic.Int32
	f.mgr = NewManager(recordingMounter{FakeMounter: f.mounter, plain: &plain, forced: &forced, lazy: &lazy}, f.exec, testr.New(t))
	f.mgr.mountInfo = f.mountInfo
	a, b := f.path("pods/a/mount"), f.path("pods/b/mount")
	for _, target := range []string{a, b} {
		if err := f.mgr.MountNFS(t.Context(), NFSRequest{VolumeID: "v", Source: "sm.ns.svc:/v", TargetPath: target}); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.mgr.Unpublish(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	if p, fo, l := plain.Load(), forced.Load(), lazy.Load(); p != 0 || fo != 0 || l != 1 {
		t.Errorf("unpublish beside another mount of the share: %d plain, %d forced, %d lazy unmounts; want 1 lazy", p, fo, l)
	}
	if f.mounts() != 1 {
		t.Errorf("%d mounts left, want the other pod's", f.mounts())
	}
	if err := f.mgr.Unpublish(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	if p, fo, l := plain.Load(), forced.Load(), lazy.Load(); p != 0 || fo != 1 || l != 1 {
		t.Errorf("unpublish of the last mount: %d plain, %d forced, %d lazy unmounts in all; want 1 forced, 1 lazy", p, fo, l)
	}
	if f.mounts() != 0 {
		t.Errorf("%d mounts left", f.mounts())
	}
}
