package mount

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// A real process holding a staged loop device open: unstage refuses with a
// HeldOpenError naming its pid and command, and leaves the mount in place.
func TestRootUnstageHeldOpenNamesHolder(t *testing.T) {
	e := newRootEnv(t)
	req := e.stage(t, e.image(t, "vol", 64*mib), StageRequest{VolumeID: "v", FSType: "ext4"})
	dev, staging := req.Device, req.StagingPath
	holder := holdOpen(t, dev)
	_, err := e.mgr.Unstage(e.ctx, staging)
	var held *HeldOpenError
	if !errors.As(err, &held) || !errors.Is(err, ErrInUse) {
		t.Fatalf("unstage with the device held open: want a HeldOpenError (ErrInUse), got %v", err)
	}
	pid := holder.Process.Pid
	if held.Device != dev || len(held.Holders) != 1 || held.Holders[0].PID != pid || held.Holders[0].Command != "sleep" {
		t.Fatalf("HeldOpenError %+v: want device %s held by pid %d (sleep)", held, dev, pid)
	}
	if msg := err.Error(); !strings.Contains(msg, "pid "+strconv.Itoa(pid)+" (sleep)") || !strings.Contains(msg, dev) {
		t.Errorf("message %q does not name the device, pid and command", msg)
	}
	if n := mountsOf(t, dev); n != 1 {
		t.Fatalf("%d mounts of %s after the refused unstage, want the staging mount kept", n, dev)
	}
	_ = holder.Process.Kill()
	_ = holder.Wait()
	if got, err := e.mgr.Unstage(e.ctx, staging); err != nil || got != dev {
		t.Fatalf("unstage after the holder ended: %q %v", got, err)
	}
	if err := e.loop.Detach(e.ctx, dev); err != nil {
		t.Fatal(err)
	}
}

// describeHolder reads comm and cgroup below a proc root; a gone process is
// named by its pid alone.
func TestDescribeHolder(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "77")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{
		"comm":   "dd\n",
		"cgroup": "0::/kubepods/besteffort/pod8d3f4a2e-1b2c-4d5e-8f90-0a1b2c3d4e5f/c1\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h := describeHolder(root, 77)
	if h.String() != "pid 77 (dd) in pod 8d3f4a2e-1b2c-4d5e-8f90-0a1b2c3d4e5f" {
		t.Errorf("holder %q", h)
	}
	if g := describeHolder(root, 78); g.String() != "pid 78" {
		t.Errorf("gone holder %q", g)
	}
}
