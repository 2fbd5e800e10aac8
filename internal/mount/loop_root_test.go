package mount

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/blockdev"
	"github.com/berth-io/berth/internal/blockdev/blockdevtest"
	"github.com/berth-io/berth/internal/blockdev/imagefile"
	"github.com/berth-io/berth/internal/keeper"
	"github.com/berth-io/berth/internal/testenv"
)

// findBound bounds the lookups below well under the 30 s a stalled
// lookup took (losetup's timeout).
const findBound = 5 * time.Second

// A loop device over a FUSE file whose server is gone (the connection
// held, nobody answering: a userspace volume while its server restarts)
// does not hold up finding another file's device.
func TestRootLoopFindPastStalledFUSE(t *testing.T) {
	e := newRootEnv(t)
	mine := e.image(t, "mine", 16*mib)
	want := e.attach(t, mine)
	stalled := stalledFUSEFile(t, e)

	ctx, cancel := context.WithTimeout(e.ctx, findBound)
	defer cancel()
	start := time.Now()
	dev, found, err := e.loop.Find(ctx, mine)
	if err != nil || !found || dev != want {
		t.Fatalf("find %s next to a stalled loop device (over %s): got %q %v %v, want %s", mine, stalled, dev, found, err, want)
	}
	t.Logf("found %s in %s next to a stalled loop device", dev, time.Since(start))
}

// stalledFUSEFile serves an image as a FUSE file (blockdev's server, in
// this process), attaches a loop device to it and stops the server with
// the connection still open. Cleanup aborts the connection (fusectl) and
// removes the device and mounts.
func stalledFUSEFile(t *testing.T, e *rootEnv) string {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("needs /dev/fuse: %v", err)
	}
	img, err := imagefile.Open(e.image(t, "served", 16*mib), false)
	if err != nil {
		t.Fatal(err)
	}
	srv := blockdevtest.Serve(t, img, 1)
	var dev string
	t.Cleanup(func() {
		srv.Stop()
		if err := testenv.AbortFUSE(srv.Mountpoint); err != nil {
			t.Errorf("the test's FUSE connection: %v", err)
		}
		<-srv.Done
		_ = unix.Close(srv.FD)
		if dev != "" {
			if err := e.loop.Detach(e.ctx, dev); err != nil {
				t.Errorf("detach %s: %v", dev, err)
			}
		}
		if err := (keeper.HostKernel{}).Unmount(srv.Mountpoint); err != nil {
			t.Error(err)
		}
		_ = img.Close()
	})
	select {
	case <-srv.Server.Ready():
	case err := <-srv.Done:
		t.Fatalf("FUSE server ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("FUSE server not ready after 10 s")
	}
	file := filepath.Join(srv.Mountpoint, blockdev.FileName)
	dev = e.attach(t, file)
	srv.Stop()
	// Once the kernel's cached attributes expire (blockdev's attrValid,
	// 1 s), a stat of the file waits for a server.
	time.Sleep(1500 * time.Millisecond)
	return file
}

// A file of the same path in another mount namespace (another node's
// volume on a kernel two test nodes share) is never taken for ours:
// neither while ours does not exist, nor next to ours.
func TestRootLoopFindIgnoresOtherMountNamespace(t *testing.T) {
	e := newRootEnv(t)
	dir := e.path("ns")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "same.img")
	other := attachInOtherNamespace(t, e, dir, "same.img")

	ctx, cancel := context.WithTimeout(e.ctx, findBound)
	defer cancel()
	if dev, found, err := e.loop.Find(ctx, file); err != nil || found {
		t.Fatalf("find %s, no such file here: got %q %v %v, want none (%s is the other namespace's)", file, dev, found, err, other)
	}
	e.image(t, "ns/same", 16*mib)
	mine := e.attach(t, file)
	if mine == other {
		t.Fatalf("attach %s returned the other namespace's device %s", file, other)
	}
	if dev, found, err := e.loop.Find(ctx, file); err != nil || !found || dev != mine {
		t.Fatalf("find %s: got %q %v %v, want %s (not %s)", file, dev, found, err, mine, other)
	}
}

// attachInOtherNamespace mounts a tmpfs over dir in a new mount namespace,
// makes name there and attaches a loop device to it; the namespace lives
// (a sleep in it) until the test ends.
func attachInOtherNamespace(t *testing.T, e *rootEnv, dir, name string) string {
	t.Helper()
	cmd := exec.Command("sh", "-c", `mount -t tmpfs berth-test "$1" && truncate -s 16M "$1/$2" && losetup --find --show "$1/$2" && exec sleep 600`,
		"sh", dir, name)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS} // and / private
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var dev string
	t.Cleanup(func() {
		if dev != "" {
			if err := e.loop.Detach(e.ctx, dev); err != nil {
				t.Errorf("detach %s: %v", dev, err)
			}
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if dev = strings.TrimSpace(line); !isDevPath(dev) {
		t.Fatalf("attach in another mount namespace: %q %v", line, err)
	}
	// What makes the case: sysfs names both files alike.
	shown, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
	if err != nil || strings.TrimSpace(string(shown)) != filepath.Join(dir, name) {
		t.Fatalf("sysfs names the other namespace's file %q (%v), want %s", shown, err, filepath.Join(dir, name))
	}
	return dev
}

// A device attached in a mount namespace that is gone (the agent's
// container restarted) is still found: sysfs names its file by a tail of
// the path, below the mount that held it.
func TestRootLoopFindAfterNamespaceGone(t *testing.T) {
	e := newRootEnv(t)
	dir := e.path("gone")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := e.image(t, "gone/vol", 16*mib)
	cmd := exec.Command("sh", "-c", `mount --bind "$1" "$1" && losetup --find --show "$2"`, "sh", dir, file)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	out, err := cmd.Output()
	want := strings.TrimSpace(string(out))
	if err != nil || !isDevPath(want) {
		t.Fatalf("attach in another mount namespace: %q %v", out, err)
	}
	t.Cleanup(func() { _ = e.loop.Detach(e.ctx, want) })
	shown, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(want), "loop", "backing_file"))
	if err != nil || strings.TrimSpace(string(shown)) != "/vol.img" {
		t.Fatalf("sysfs names the file %q (%v), want /vol.img", shown, err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, findBound)
	defer cancel()
	if dev, found, err := e.loop.Find(ctx, file); err != nil || !found || dev != want {
		t.Fatalf("find %s: got %q %v %v, want %s", file, dev, found, err, want)
	}
}
