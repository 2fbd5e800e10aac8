package flexvolume

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// TestStaleEntriesOutsideBerthRefused: the stale list is an API object, so
// its paths are not trusted. Entries whose mount dir or staging path lies
// outside kubelet's volume folders and berth's staging root, or reaches
// one of those folders through a symlink, are refused and taken off the
// list, and the real mounts they point at stay mounted.
func TestStaleEntriesOutsideBerthRefused(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	outside := filepath.Join(f.dir, "outside")
	tmpfs := func(dir string) string {
		t.Helper()
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatalf("mount tmpfs at %s: %v", dir, err)
		}
		t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
		if err := os.WriteFile(filepath.Join(dir, "keep"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	podMount := tmpfs(filepath.Join(outside, "pod"))
	stageMount := tmpfs(filepath.Join(outside, "stage"))
	// A pod folder under kubelet's root that is a symlink to elsewhere.
	linkedMount := tmpfs(filepath.Join(outside, "linked", "volumes", "berth.io~berth", "data"))
	if err := os.MkdirAll(filepath.Join(f.kubeletDir, "pods"), 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(f.kubeletDir, "pods", "linked-uid")
	if err := os.Symlink(filepath.Join(outside, "linked"), link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(link) })

	// Another device mounted at a staging path inside berth's folder, and
	// elsewhere: a stale stage record there may take off the mount at its
	// staging path, never every mount of a device that is not its volume's.
	foreign := filepath.Join(f.kubeletDir, "plugins", "kubernetes.io", "csi", "berth.io", "foreign", "globalmount")
	foreignElsewhere := filepath.Join(outside, "foreign")
	loopMounts(t, filepath.Join(outside, "foreign.img"), foreign, foreignElsewhere)

	now := metav1.NewTime(time.Now().Truncate(time.Second))
	nc := &v1.NodeCleanup{ObjectMeta: metav1.ObjectMeta{Name: node}}
	entries := []v1.StaleAttachment{
		{Volume: "gone-vol", MountDir: podMount, Pod: "default/p", PodUID: "u1", Reason: v1.ReasonNodeGone, FoundAt: now},
		{Volume: "gone-vol", MountDir: stageMount, StagingPath: stageMount, Reason: v1.ReasonNodeGone, FoundAt: now},
		{Volume: "gone-vol", MountDir: foreign, StagingPath: foreign, Reason: v1.ReasonNodeGone, FoundAt: now},
		{Volume: "gone-vol", MountDir: filepath.Join(link, "volumes", "berth.io~berth", "data"), Pod: "default/q", PodUID: "u2",
			Reason: v1.ReasonNodeGone, FoundAt: now},
	}
	if err := f.env.Client.Get(ctx, client.ObjectKeyFromObject(nc), nc); err == nil {
		nc.Spec.Entries = append(nc.Spec.Entries, entries...)
		err = f.env.Client.Update(ctx, nc)
		if err != nil {
			t.Fatal(err)
		}
	} else {
		nc.Spec.Entries = entries
		if err := f.env.Client.Create(ctx, nc); err != nil {
			t.Fatal(err)
		}
	}
	// The agent works through the list every second.
	waitFor(t, "the agent to take the entries off its stale list", func() bool {
		return f.env.Client.Get(ctx, client.ObjectKeyFromObject(nc), nc) == nil && len(nc.Spec.Entries) == 0
	})
	for _, dir := range []string{podMount, stageMount, linkedMount, foreignElsewhere} {
		if !mounted(t, dir) {
			t.Errorf("%s was unmounted by a stale entry outside berth's folders", dir)
		}
		if _, err := os.Stat(filepath.Join(dir, "keep")); err != nil {
			t.Errorf("%s: %v", dir, err)
		}
	}
}

// loopMounts makes an ext4 image on a loop device, mounts it at each dir
// with a file "keep", and undoes all that when the test ends.
func loopMounts(t *testing.T, image string, dirs ...string) {
	t.Helper()
	if err := os.WriteFile(image, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(image, 16<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", image).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	out, err := exec.Command("losetup", "--find", "--show", image).Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
	for _, dir := range dirs {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount(dev, dir, "ext4", 0, ""); err != nil {
			t.Fatalf("mount %s at %s: %v", dev, dir, err)
		}
		t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	}
	if err := os.WriteFile(filepath.Join(dirs[len(dirs)-1], "keep"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
}
