package flexvolume

import (
	"context"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	flex "github.com/berth-io/berth/internal/flexvolume"
)

// TestUnmountWithLostRecordReleasesStaging: two pods mount one RWO volume,
// then its Attachment is deleted (a lost record). Unmounting the first pod
// unmounts only its dir: the staging stays while the second pod's mount
// does. Unmounting the second releases the staging mount and the loop
// device, found through the mount table.
func TestUnmountWithLostRecordReleasesStaging(t *testing.T) {
	f := setup(t)
	image := f.volume(t, "flex", "flex-lost", v1.ReadWriteOnce)
	uidA := f.pod(t, podSpec{ns: "default", name: "lost-a", volume: inline("flex-lost", "")})
	uidB := f.pod(t, podSpec{ns: "default", name: "lost-b", volume: inline("flex-lost", "")})
	dirA, dirB := f.podDir(uidA, "flex-lost"), f.podDir(uidB, "flex-lost")
	for _, m := range []struct{ dir, pod, uid string }{{dirA, "lost-a", uidA}, {dirB, "lost-b", uidB}} {
		res, _ := f.run(t, "mount", m.dir, options(t, m.pod, m.uid, "flex-lost"))
		want(t, "mount "+m.pod, res, flex.StatusSuccess)
	}
	if loops(t, image) != 1 {
		t.Fatalf("loop devices after two mounts: %d", loops(t, image))
	}
	att := &v1.Attachment{}
	ctx := context.Background()
	if err := f.env.Client.Get(ctx, client.ObjectKey{Name: "flex-lost"}, att); err != nil {
		t.Fatal(err)
	}
	if err := f.env.Client.Delete(ctx, att); err != nil {
		t.Fatal(err)
	}

	res, _ := f.run(t, "unmount", dirA)
	want(t, "unmount of the first pod without a record", res, flex.StatusSuccess)
	if mounted(t, dirA) || !mounted(t, dirB) || loops(t, image) != 1 {
		t.Fatalf("after the first unmount: dir A mounted %t, dir B mounted %t, loop devices %d (want false, true, 1)",
			mounted(t, dirA), mounted(t, dirB), loops(t, image))
	}
	res, _ = f.run(t, "unmount", dirB)
	want(t, "unmount of the last pod without a record", res, flex.StatusSuccess)
	if mounted(t, dirB) || loops(t, image) != 0 {
		t.Fatalf("after the last unmount: dir B mounted %t, loop devices %d: the staging leaked", mounted(t, dirB), loops(t, image))
	}
}
