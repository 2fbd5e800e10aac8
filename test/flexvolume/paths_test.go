package flexvolume

import (
	"context"
	"os"
	"path/filepath"
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

	now := metav1.NewTime(time.Now().Truncate(time.Second))
	nc := &v1.NodeCleanup{ObjectMeta: metav1.ObjectMeta{Name: node}}
	entries := []v1.StaleAttachment{
		{Volume: "gone-vol", MountDir: podMount, Pod: "default/p", PodUID: "u1", Reason: v1.ReasonNodeGone, FoundAt: now},
		{Volume: "gone-vol", MountDir: stageMount, StagingPath: stageMount, Reason: v1.ReasonNodeGone, FoundAt: now},
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
	for _, dir := range []string{podMount, stageMount, linkedMount} {
		if !mounted(t, dir) {
			t.Errorf("%s was unmounted by a stale entry outside berth's folders", dir)
		}
		if _, err := os.Stat(filepath.Join(dir, "keep")); err != nil {
			t.Errorf("%s: %v", dir, err)
		}
	}
}
