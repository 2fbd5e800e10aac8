package agent

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRootSnapshotOfSharedVolumeIsConsistent: an RWX volume's device is
// staged here as the share manager's block device, and its ext4 is mounted
// only in another mount namespace (the share manager's pod), where a
// writer keeps changing it. Snapshots and a clone on a data dir without
// reflink are taken frozen through a second mount of the same filesystem:
// each is clean with nothing to recover and holds whole files; the share
// manager's mount stays, and the agent's own is gone afterwards. Today's
// main sees no mount to freeze and refuses every copy (ErrSourceInUse).
func TestRootSnapshotOfSharedVolumeIsConsistent(t *testing.T) {
	e := newRWXQuiesceEnv(t)
	ctx := t.Context()
	e.stage(t, true)
	if out, err := exec.Command("mkfs.ext4", "-q", e.dev).CombinedOutput(); err != nil {
		t.Fatalf("mkfs: %v: %s", err, out)
	}
	pid, export := shareManagerMount(t, e.dev)

	e.checkFrozen(t, e.copiesUnderWriter(t, export, true))
	mounts, err := os.ReadFile(fmt.Sprintf("/proc/%d/mounts", pid))
	if err != nil || !strings.Contains(string(mounts), e.dev+" ") {
		t.Errorf("the share manager's mount of %s is gone (%v)", e.dev, err)
	}
	if own, err := os.ReadFile("/proc/self/mounts"); err != nil || strings.Contains(string(own), e.dev+" ") {
		t.Errorf("a mount of %s is left in the agent's namespace (%v)", e.dev, err)
	}
	if _, err := e.images.CreateSnapshot(ctx, "snap-after", "vol"); err != nil {
		t.Errorf("snapshot after the writer stopped: %v", err)
	}
}

// shareManagerMount mounts dev in a new mount namespace, as a share
// manager's pod does, and returns the pid holding that namespace and the
// mount's path as seen from here (through its /proc root). The namespace
// ends with the test.
func shareManagerMount(t *testing.T, dev string) (int, string) {
	t.Helper()
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	mnt := filepath.Join(dir, "export")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		fmt.Sprintf("mount %s %s && touch %s && exec sleep 600", dev, mnt, ready))
	if err := cmd.Start(); err != nil {
		t.Skipf("unshare: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	})
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the mount in a new namespace did not come up")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if own, _ := os.ReadFile("/proc/self/mounts"); strings.Contains(string(own), dev+" ") {
		t.Fatalf("%s is mounted in the test's own namespace too", dev)
	}
	return cmd.Process.Pid, filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "root", mnt)
}
