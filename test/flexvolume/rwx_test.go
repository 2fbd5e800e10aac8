package flexvolume

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	flex "github.com/berth-io/berth/internal/flexvolume"
	"github.com/berth-io/berth/internal/testenv"
)

// TestPodsShareOneStaging: two pods on this node mount one ReadWriteOnce
// volume (one staging, one loop device). (A ReadWriteMany filesystem
// volume is served over NFS by its share manager instead: agent/share.go.) When the first
// unmounts, the second keeps reading and writing through the staging that
// stays, with its entry and the stage record left in the Attachment. The
// last unmount unstages: staging unmounted, loop device detached,
// Attachment gone.
func TestPodsShareOneStaging(t *testing.T) {
	f := setup(t)
	const vol = "flex-rwx"
	image := f.volume(t, "flex", vol, v1.ReadWriteOnce)
	uidA := f.pod(t, podSpec{ns: "default", name: "rwx-a", volume: inline(vol, "")})
	uidB := f.pod(t, podSpec{ns: "default", name: "rwx-b", volume: inline(vol, "")})
	dirA, dirB := f.podDir(uidA, vol), f.podDir(uidB, vol)
	for _, m := range []struct{ dir, pod, uid string }{{dirA, "rwx-a", uidA}, {dirB, "rwx-b", uidB}} {
		res, _ := f.run(t, "mount", m.dir, options(t, m.pod, m.uid, vol))
		want(t, "mount of "+m.pod, res, flex.StatusSuccess)
	}
	staging := f.flexStaging(vol)
	if !mounted(t, staging) || loops(t, image) != 1 || len(entries(t, f, vol)) != 3 {
		t.Fatalf("two pods mounted: staging mounted %t, loop devices %d, entries %+v; want one staging, one device, stage record + 2 pods",
			mounted(t, staging), loops(t, image), entries(t, f, vol))
	}
	testenv.WriteSynced(t, filepath.Join(dirA, "from-a"), []byte("written by A"))

	res, _ := f.run(t, "unmount", dirA)
	want(t, "unmount of the first pod", res, flex.StatusSuccess)
	if mounted(t, dirA) || !mounted(t, dirB) || !mounted(t, staging) || loops(t, image) != 1 {
		t.Fatalf("after the first unmount: A mounted %t, B mounted %t, staging mounted %t, loop devices %d; want false, true, true, 1",
			mounted(t, dirA), mounted(t, dirB), mounted(t, staging), loops(t, image))
	}
	left := entries(t, f, vol)
	pods := 0
	for _, e := range left {
		if !e.IsStage() {
			pods++
			if e.Pod != "rwx-b" || e.MountDir != dirB {
				t.Errorf("entry left for another pod than B: %+v", e)
			}
		}
	}
	if len(left) != 2 || pods != 1 {
		t.Errorf("entries after the first unmount: %+v; want the stage record and pod B", left)
	}
	// B reads what A wrote and goes on writing, through the kernel's page
	// cache and down to the device.
	if b, err := os.ReadFile(filepath.Join(dirB, "from-a")); err != nil || string(b) != "written by A" {
		t.Errorf("B reads A's file: %q %v", b, err)
	}
	for i := range 20 {
		name := filepath.Join(dirB, fmt.Sprintf("from-b-%d", i))
		testenv.WriteSynced(t, name, []byte(name))
		if b, err := os.ReadFile(name); err != nil || string(b) != name {
			t.Fatalf("B reads back %s: %q %v", name, b, err)
		}
	}

	res, _ = f.run(t, "unmount", dirB)
	want(t, "unmount of the last pod", res, flex.StatusSuccess)
	if mounted(t, dirB) || mounted(t, staging) || loops(t, image) != 0 || entries(t, f, vol) != nil {
		t.Fatalf("after the last unmount: B mounted %t, staging mounted %t, loop devices %d, entries %+v; want nothing left",
			mounted(t, dirB), mounted(t, staging), loops(t, image), entries(t, f, vol))
	}
}
