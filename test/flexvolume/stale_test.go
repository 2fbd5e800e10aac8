package flexvolume

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
	flex "github.com/berth-io/berth/internal/flexvolume"
)

// TestStaleListAfterRestart: while the agent is down, its node is marked
// out of service and another node takes the volume over (lock breaking moves
// this node's entries to its stale list). When the agent starts again it
// works through the list: the pod's mount and the staging mount are gone
// and the loop device detached.
func TestStaleListAfterRestart(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	image := f.volume(t, "flex", "stale-a", v1.ReadWriteOnce)
	uid := f.pod(t, podSpec{ns: "default", name: "pod-e", volume: inline("stale-a", "")})
	dir := f.podDir(uid, "stale-a")
	res, _ := f.run(t, "mount", dir, options(t, "pod-e", uid, "stale-a"))
	want(t, "mount", res, flex.StatusSuccess)

	agentBack := f.agentDown(t, syscall.SIGTERM)
	if !mounted(t, dir) || loops(t, image) != 1 {
		t.Fatal("stopping the agent should leave the volume mounted")
	}

	// The node goes out of service; another node takes the volume.
	setTaint(t, f, true)
	other := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "other-node"}}
	if err := f.env.Client.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.env.Client.Delete(ctx, other) })
	fencer := fence.New(f.env.Client, record.NewFakeRecorder(16), clock.RealClock{}, testLogger(t), fence.Options{})
	staging := filepath.Join(f.dir, "other-staging", "stale-a")
	req := fence.Request{Volume: "stale-a", Node: "other-node", MountDir: staging, StagingPath: staging, AccessMode: v1.ReadWriteOnce}
	if err := fencer.Acquire(ctx, req); err != nil {
		t.Fatalf("takeover by another node: %v", err)
	}
	t.Cleanup(func() { _ = fencer.Release(ctx, "stale-a", "other-node", staging) })
	nc := &v1.NodeCleanup{}
	if err := f.env.Client.Get(ctx, client.ObjectKey{Name: node}, nc); err != nil || len(nc.Spec.Entries) != 2 {
		t.Fatalf("stale list of %s after the takeover: %+v (%v), want the stage record and the pod's mount", node, nc.Spec.Entries, err)
	}

	// The node comes back; its agent starts and works through the list.
	setTaint(t, f, false)
	agentBack()
	waitFor(t, "the stale list to be worked through", func() bool {
		return f.env.Client.Get(ctx, client.ObjectKey{Name: node}, nc) == nil && len(nc.Spec.Entries) == 0
	})
	if mounted(t, dir) {
		t.Error("the pod's mount is still there")
	}
	if n := loops(t, image); n != 0 {
		t.Errorf("%d loop devices left on the image", n)
	}
	t.Logf("stale list done: pending %d, last processed %v", nc.Status.Pending, nc.Status.LastProcessed)
}

func setTaint(t *testing.T, f *fixture, on bool) {
	t.Helper()
	n := &corev1.Node{}
	if err := f.env.Client.Get(context.Background(), client.ObjectKey{Name: node}, n); err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = nil
	if on {
		n.Spec.Taints = []corev1.Taint{{Key: "node.kubernetes.io/out-of-service", Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}}
	}
	if err := f.env.Client.Update(context.Background(), n); err != nil {
		t.Fatal(err)
	}
}

func testLogger(t *testing.T) logr.Logger { return testr.New(t) }

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
