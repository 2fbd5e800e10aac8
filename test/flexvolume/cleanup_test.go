package flexvolume

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	flex "github.com/berth-io/berth/internal/flexvolume"
)

// stand-in for the operator's finalizer: the test lifts it once the node
// reported, as the operator does when every node has.
const holdFinalizer = "test.berth.io/hold"

// TestClusterDeletionCleansNode: deleting a StorageCluster makes the agent
// unmount and detach every volume of it on this node, even one a process
// holds open, and report the node; nothing of it is left.
func TestClusterDeletionCleansNode(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	sc := &v1.StorageCluster{ObjectMeta: metav1.ObjectMeta{Name: "doomed", Finalizers: []string{holdFinalizer}}}
	if err := f.env.Client.Create(ctx, sc); err != nil {
		t.Fatal(err)
	}
	keep := f.volume(t, "flex", "survivor", v1.ReadWriteOnce)
	images := map[string]string{
		"doomed-a": f.volume(t, "doomed", "doomed-a", v1.ReadWriteOnce),
		"doomed-b": f.volume(t, "doomed", "doomed-b", v1.ReadWriteMany),
	}
	dirs := map[string]string{
		f.podDir("dddddddd-0001", "doomed-a"): "doomed-a",
		f.podDir("dddddddd-0002", "doomed-a"): "doomed-a",
		f.podDir("dddddddd-0003", "doomed-b"): "doomed-b",
		f.podDir("dddddddd-0004", "survivor"): "survivor",
	}
	for dir, vol := range dirs {
		uid := filepath.Base(filepath.Dir(filepath.Dir(filepath.Dir(dir))))
		res, _ := f.run(t, "mount", dir, options(t, "pod-"+uid, uid, vol))
		want(t, "mount "+vol, res, flex.StatusSuccess)
	}
	survivorDir := f.podDir("dddddddd-0004", "survivor")
	t.Cleanup(func() { f.run(t, "unmount", survivorDir) })

	// A pod still uses doomed-a: a process holds a file open in it.
	busy := filepath.Join(f.podDir("dddddddd-0001", "doomed-a"), "busy")
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
	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := f.env.Client.Get(ctx, client.ObjectKeyFromObject(sc), sc); err != nil {
			t.Fatal(err)
		}
		if slices.Contains(sc.Status.CleanedNodes, node) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node not reported cleaned within 60s: %+v", sc.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}

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

	// The operator lifts its finalizer once every node reported.
	if controllerutil.RemoveFinalizer(sc, holdFinalizer) {
		if err := f.env.Client.Update(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.env.Client.Get(ctx, client.ObjectKeyFromObject(sc), sc); !apierrors.IsNotFound(err) {
		t.Errorf("StorageCluster still there: %v", err)
	}
}
