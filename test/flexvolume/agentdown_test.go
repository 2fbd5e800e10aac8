package flexvolume

import (
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	flex "github.com/berth-io/berth/internal/flexvolume"
)

// TestDriverWithAgentDownChangesNothing: with the agent crashed (SIGKILL:
// its socket file stays behind) the installed driver's init, mount and
// unmount each print one JSON object that says the agent is not reachable,
// and change nothing: the mounted pod stays mounted and recorded, the new
// pod gets no mount, loop device or Attachment entry. init still succeeds
// (kubelet drops a driver whose init fails until the plugin folder changes
// again, and kubelet may probe before the agent serves): its message says
// the agent is not reachable. Once the agent is back, each call works.
func TestDriverWithAgentDownChangesNothing(t *testing.T) {
	f := setup(t)
	shared := f.volume(t, "flex", "down-shared", v1.ReadWriteOnce)
	fresh := f.volume(t, "flex", "down-fresh", v1.ReadWriteOnce)
	uidA := f.pod(t, podSpec{ns: "default", name: "down-a", volume: inline("down-shared", "")})
	uidB := f.pod(t, podSpec{ns: "default", name: "down-b", volume: inline("down-shared", "")})
	uidC := f.pod(t, podSpec{ns: "default", name: "down-c", volume: inline("down-fresh", "")})
	dirA, dirB, dirC := f.podDir(uidA, "down-shared"), f.podDir(uidB, "down-shared"), f.podDir(uidC, "down-fresh")
	res, _ := f.run(t, "mount", dirA, options(t, "down-a", uidA, "down-shared"))
	want(t, "mount of pod A while the agent runs", res, flex.StatusSuccess)
	before := entries(t, f, "down-shared")

	agentBack := f.agentDown(t, syscall.SIGKILL)

	res, _ = f.run(t, "init")
	want(t, "init with the agent down", res, flex.StatusSuccess)
	if res.Capabilities == nil || res.Capabilities.Attach || !strings.Contains(res.Message, "agent not reachable") {
		t.Errorf("init with the agent down: capabilities %+v, message %q; want attach false and a message saying the agent is not reachable",
			res.Capabilities, res.Message)
	}
	for _, call := range []struct {
		what string
		args []string
	}{
		{"mount of pod B (volume staged)", []string{"mount", dirB, options(t, "down-b", uidB, "down-shared")}},
		{"mount of pod C (volume not staged)", []string{"mount", dirC, options(t, "down-c", uidC, "down-fresh")}},
		{"unmount of pod A", []string{"unmount", dirA}},
	} {
		res, _ := f.run(t, call.args...)
		want(t, call.what+" with the agent down", res, flex.StatusFailure)
		if !strings.Contains(res.Message, f.sock) || !strings.Contains(res.Message, "is berth agent running on this node?") {
			t.Errorf("%s with the agent down: message %q does not name the agent socket and ask whether the agent runs", call.what, res.Message)
		}
	}
	if !mounted(t, dirA) || mounted(t, dirB) || mounted(t, dirC) {
		t.Errorf("with the agent down: mounted A %t, B %t, C %t; want only A", mounted(t, dirA), mounted(t, dirB), mounted(t, dirC))
	}
	if loops(t, shared) != 1 || loops(t, fresh) != 0 {
		t.Errorf("with the agent down: loop devices %d on the staged volume (want 1), %d on the other (want 0)", loops(t, shared), loops(t, fresh))
	}
	if now := entries(t, f, "down-shared"); !reflect.DeepEqual(now, before) {
		t.Errorf("Attachment entries changed with the agent down:\n%+v\nwant\n%+v", now, before)
	}
	if now := entries(t, f, "down-fresh"); now != nil {
		t.Errorf("Attachment of the unstaged volume made with the agent down: %+v", now)
	}

	agentBack()
	res, _ = f.run(t, "init")
	want(t, "init with the agent back", res, flex.StatusSuccess)
	if !strings.HasPrefix(res.Message, "agent ready") {
		t.Errorf("init with the agent back: %q, want agent ready", res.Message)
	}
	for _, m := range []struct{ dir, opts string }{
		{dirB, options(t, "down-b", uidB, "down-shared")},
		{dirC, options(t, "down-c", uidC, "down-fresh")},
	} {
		res, _ := f.run(t, "mount", m.dir, m.opts)
		want(t, "mount with the agent back", res, flex.StatusSuccess)
	}
	for _, dir := range []string{dirA, dirB, dirC} {
		res, _ := f.run(t, "unmount", dir)
		want(t, "unmount with the agent back", res, flex.StatusSuccess)
		if mounted(t, dir) {
			t.Errorf("%s still mounted after its unmount", dir)
		}
	}
	if loops(t, shared) != 0 || loops(t, fresh) != 0 || entries(t, f, "down-shared") != nil || entries(t, f, "down-fresh") != nil {
		t.Errorf("after the last unmounts: loop devices %d and %d, entries %+v and %+v; want none",
			loops(t, shared), loops(t, fresh), entries(t, f, "down-shared"), entries(t, f, "down-fresh"))
	}
}

// entries returns the volume's Attachment entries; nil when it has no
// Attachment.
func entries(t *testing.T, f *fixture, volume string) []v1.AttachmentEntry {
	t.Helper()
	att := &v1.Attachment{}
	err := f.env.Client.Get(context.Background(), client.ObjectKey{Name: volume}, att)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return att.Spec.Attachments
}

// flexStaging is the agent's staging path of a volume mounted through
// Flexvolume.
func (f *fixture) flexStaging(volume string) string {
	return filepath.Join(f.dir, "run", "flex-staging", volume)
}

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
