package agent

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/mount"
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
	e := newQuiesceEnv(t, &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "vol"}, Spec: v1.VolumeSpec{StorageCluster: "c",
		Size: resource.MustParse("64Mi"), AccessMode: v1.ReadWriteMany, VolumeMode: v1.VolumeModeFilesystem, FSType: "ext4"}})
	ctx := t.Context()
	staging := filepath.Join(t.TempDir(), "staging")
	if err := e.mounts.Stage(ctx, mount.StageRequest{VolumeID: "vol", Device: e.dev, StagingPath: staging, Block: true}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := e.mounts.Unstage(context.Background(), staging); err != nil {
			t.Errorf("unstage: %v", err)
		}
	})
	if out, err := exec.Command("mkfs.ext4", "-q", e.dev).CombinedOutput(); err != nil {
		t.Fatalf("mkfs: %v: %s", err, out)
	}
	pid, export := shareManagerMount(t, e.dev)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var writeErr error
	wg.Go(func() { writeErr = writeFiles(export, stop) })
	var copies []string
	for i := range 3 {
		time.Sleep(200 * time.Millisecond)
		s, err := e.images.CreateSnapshot(ctx, fmt.Sprintf("snap-%d", i), "vol")
		if err != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("snapshot %d of the shared volume: %v", i, err)
		}
		copies = append(copies, s.Path)
	}
	clone, err := e.images.CreateFromVolume(ctx, "clone", "vol", 64<<20)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("clone of the shared volume: %v", err)
	}
	copies = append(copies, clone.Path)
	if writeErr != nil {
		t.Fatalf("writer in the share manager's namespace: %v", writeErr)
	}
	for _, p := range copies {
		out, err := exec.Command("e2fsck", "-fn", p).CombinedOutput()
		if err != nil {
			t.Errorf("copy %s is not a clean filesystem: %v\n%s", p, err, out)
			continue
		}
		if out, err := exec.Command("dumpe2fs", "-h", p).CombinedOutput(); err != nil || strings.Contains(string(out), "needs_recovery") {
			t.Errorf("copy %s was not taken frozen (journal needs recovery): %v\n%s", p, err, out)
		}
		checkFiles(t, e.loop, p)
	}
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
