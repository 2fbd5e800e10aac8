package mount

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	mountutils "k8s.io/mount-utils"
)

// staleMount leaves a real dead mount at dir: a FUSE mount whose connection
// is closed before any server answered, so every access gives ENOTCONN, as
// after a crashed userspace server.
func staleMount(t *testing.T, dir string) {
	t.Helper()
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("needs FUSE for a stale mount: /dev/fuse: %v", err)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0", fd)
	if err := unix.Mount("berth-stale", dir, "fuse", 0, opts); err != nil {
		_ = unix.Close(fd)
		t.Fatalf("fuse mount: %v", err)
	}
	_ = unix.Close(fd)
	if _, err := os.Stat(dir); !mountutils.IsCorruptedMnt(err) {
		t.Fatalf("mount not stale: stat gave %v", err)
	}
}

func TestRootStaleMounts(t *testing.T) {
	e := newRootEnv(t)
	target := e.path("pod/mount")
	staleMount(t, target)
	if err := e.mgr.Unpublish(e.ctx, target); err != nil {
		t.Fatalf("unpublish stale: %v", err)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Fatalf("stale target left: %v", err)
	}

	staging := e.path("staging")
	staleMount(t, staging)
	if dev, err := e.mgr.Unstage(e.ctx, staging); err != nil || dev != "" {
		t.Fatalf("unstage stale: %q %v", dev, err)
	}
	staleMount(t, staging)
	if abnormal, msg := e.mgr.Condition(e.ctx, staging); !abnormal || !strings.Contains(msg, "stale") {
		t.Fatalf("condition of stale staging: %t %q", abnormal, msg)
	}
	dev := e.attach(t, e.image(t, "vol", 64*mib))
	if err := e.mgr.Stage(e.ctx, StageRequest{Device: dev, StagingPath: staging}); err != nil {
		t.Fatalf("stage over stale mount: %v", err)
	}
	if abnormal, msg := e.mgr.Condition(e.ctx, staging); abnormal {
		t.Fatalf("restaged volume abnormal: %s", msg)
	}
	// A stale pod mount does not block publishing afresh.
	staleMount(t, target)
	if err := e.mgr.Publish(e.ctx, PublishRequest{StagingPath: staging, TargetPath: target}); err != nil {
		t.Fatalf("publish over stale target: %v", err)
	}
	if n := mountsOf(t, dev); n != 2 {
		t.Fatalf("%d mounts of %s, want staging + pod", n, dev)
	}
}
