package flexvolume

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	flex "github.com/berth-io/berth/internal/flexvolume"
	"github.com/berth-io/berth/internal/testenv"
)

// TestClusterDeletionCleansNode: deleting a StorageCluster makes the agent
// unmount and detach every volume of it on this node, even one a process
// holds open, and report the node; the operator then lets the cluster go,
// and nothing of it is left.
func TestClusterDeletionCleansNode(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	// The agent serves the cluster's data dir (it picks a volume's by its cluster).
	sc := &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "doomed"}, Spec: v1.StorageClusterSpec{DataDir: f.dataDir()}}
	if err := f.env.Client.Create(ctx, sc); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the operator's cleanup finalizer", func() bool {
		return f.env.Client.Get(ctx, client.ObjectKeyFromObject(sc), sc) == nil && len(sc.Finalizers) > 0
	})
	keep := f.volume(t, "flex", "survivor", v1.ReadWriteOnce)
	images := map[string]string{
		"doomed-a": f.volume(t, "doomed", "doomed-a", v1.ReadWriteOnce),
		"doomed-b": f.volume(t, "doomed", "doomed-b", v1.ReadWriteOnce),
	}
	dirs := map[string]string{}
	var busyDir, survivorDir string
	for i, vol := range []string{"doomed-a", "doomed-a", "doomed-b", "survivor"} {
		name := fmt.Sprintf("pod-%d", i)
		uid := f.pod(t, podSpec{ns: "default", name: name, volume: inline(vol, "")})
		dir := f.podDir(uid, vol)
		dirs[dir] = vol
		res, _ := f.run(t, "mount", dir, options(t, name, uid, vol))
		want(t, "mount "+vol, res, flex.StatusSuccess)
		switch i {
		case 0:
			busyDir = dir
		case 3:
			survivorDir = dir
		}
	}
	t.Cleanup(func() { f.run(t, "unmount", survivorDir) })

	// A pod still uses doomed-a: a process holds a file open in it.
	busy := filepath.Join(busyDir, "busy")
	if err := os.WriteFile(busy, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	holder := exec.Command("sleep", "300")
	fh, err := os.Open(busy)
	if err != nil {
		t.Fatal(err)
	}
	holder.ExtraFiles = []*os.File{fh}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	_ = fh.Close()
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })

	if err := f.env.Client.Delete(ctx, sc); err != nil {
		t.Fatal(err)
	}
	// The agent reports the node; the operator then removes its finalizer.
	var last v1.StorageCluster
	waitFor(t, "the StorageCluster to go", func() bool {
		err := f.env.Client.Get(ctx, client.ObjectKeyFromObject(sc), sc)
		if err == nil {
			last = *sc
		}
		return apierrors.IsNotFound(err)
	})
	t.Logf("cluster gone; last status seen: phase %s, cleaned nodes %v", last.Status.Phase, last.Status.CleanedNodes)

	for dir, vol := range dirs {
		if vol == "survivor" {
			if !mounted(t, dir) {
				t.Errorf("a volume of another cluster was unmounted: %s", dir)
			}
			continue
		}
		if mounted(t, dir) {
			t.Errorf("%s still mounted at %s", vol, dir)
		}
	}
	// The kernel keeps a lazily unmounted filesystem, and so its loop
	// device (detached with autoclear), until the last open file closes:
	// once the process holding doomed-a goes, the device goes too.
	_ = holder.Process.Kill()
	_ = holder.Wait()
	for vol, image := range images {
		for i := 0; i < 50 && loops(t, image) != 0; i++ {
			time.Sleep(100 * time.Millisecond)
		}
		if n := loops(t, image); n != 0 {
			t.Errorf("%s: %d loop devices left", vol, n)
		}
		att := &v1.Attachment{}
		if err := f.env.Client.Get(ctx, client.ObjectKey{Name: vol}, att); !apierrors.IsNotFound(err) {
			t.Errorf("%s: Attachment left: %+v (%v)", vol, att.Spec.Attachments, err)
		}
	}
	if loops(t, keep) != 1 {
		t.Error("the other cluster's volume lost its loop device")
	}
}

func waitFor(t *testing.T, what string, done func() bool) {
	t.Helper()
	testenv.WaitFor(t, 60*time.Second, what, done)
}

// TestMountRefusedWhileClusterDeleting: a Flexvolume mount of a volume whose
// StorageCluster is being deleted fails naming the cluster and makes no
// mount, loop device or Attachment.
func TestMountRefusedWhileClusterDeleting(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	// A finalizer of the test's own keeps the cluster in its deleting state.
	sc := &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "doomed-flex", Finalizers: []string{"test.berth.io/hold"}},
		Spec: v1.StorageClusterSpec{DataDir: f.dataDir()}}
	if err := f.env.Client.Create(ctx, sc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.env.Client.Get(ctx, client.ObjectKeyFromObject(sc), sc); err == nil {
			sc.Finalizers = nil
			_ = f.env.Client.Update(ctx, sc)
		}
	})
	image := f.volume(t, sc.Name, "doomed-flex-vol", v1.ReadWriteOnce)
	if err := f.env.Client.Delete(ctx, sc); err != nil {
		t.Fatal(err)
	}
	uid := f.pod(t, podSpec{ns: "default", name: "late", volume: inline("doomed-flex-vol", "")})
	dir := f.podDir(uid, "doomed-flex-vol")
	res, _ := f.run(t, "mount", dir, options(t, "late", uid, "doomed-flex-vol"))
	want(t, "mount while the cluster is being deleted", res, flex.StatusFailure)
	if !strings.Contains(res.Message, sc.Name) {
		t.Errorf("refusal does not name the cluster %s: %s", sc.Name, res.Message)
	}
	if mounted(t, dir) || loops(t, image) != 0 {
		t.Errorf("refused mount left: mounted %t, loop devices %d", mounted(t, dir), loops(t, image))
	}
	if err := f.env.Client.Get(ctx, client.ObjectKey{Name: "doomed-flex-vol"}, &v1.Attachment{}); !apierrors.IsNotFound(err) {
		t.Errorf("refused mount left an Attachment (%v)", err)
	}
}
