package flexvolume

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	flex "github.com/berth-io/berth/internal/flexvolume"
)

// TestForgedPodIdentityRefused: the pod a Flexvolume mount is for is the
// one kubelet's mount dir names (pods/<uid>/...), bound to this node, whose
// spec names the volume. Options that say otherwise (another pod's
// namespace, name or UID, another service account or volume name, a pod on
// another node, a pod that does not mount the volume) are refused: no
// mount, no loop device, no Attachment entry. The same call with the pod's
// own options still mounts.
func TestForgedPodIdentityRefused(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	image := f.volume(t, "flex", "ident-vol", v1.ReadWriteOncePod) // owned by "default"
	// The intruder's pod lives in a namespace that does not own the volume
	// but its spec does name it; the victim's pod in "default" owns it.
	intruder := f.pod(t, podSpec{ns: "intruder", name: "evil", volume: inline("data", "ident-vol")})
	victim := f.pod(t, podSpec{ns: "default", name: "victim", volume: inline("data", "ident-vol")})
	elsewhere := f.pod(t, podSpec{ns: "default", name: "elsewhere", volume: inline("data", "ident-vol"), node: "other-node"})
	unrelated := f.pod(t, podSpec{ns: "default", name: "unrelated", volume: inline("data", "some-other-vol")})
	named := map[string]string{flex.OptVolume: "ident-vol"}
	with := func(m map[string]string) map[string]string {
		out := map[string]string{flex.OptVolume: "ident-vol"}
		for k, v := range m {
			out[k] = v
		}
		return out
	}

	for _, tc := range []struct {
		name, uid, pod, volName string
		opts                    map[string]string
		says                    string
	}{
		// The forged namespace and name of a pod that owns the volume: the
		// pod found has another UID than the mount dir's.
		{"another pod's namespace and name", intruder, "victim", "data", named, victim},
		// Only the namespace forged: no such pod there.
		{"another namespace", intruder, "evil", "data", with(map[string]string{flex.OptPodNamespace: "default"}), "no pod default/evil"},
		{"another pod's UID", intruder, "evil", "data", with(map[string]string{flex.OptPodNamespace: "intruder", flex.OptPodUID: victim}), victim},
		{"another volume name", victim, "victim", "data", with(map[string]string{flex.OptVolumeName: "other"}), "other"},
		{"another service account", victim, "victim", "data", with(map[string]string{"kubernetes.io/serviceAccount.name": "admin"}), "admin"},
		{"a pod on another node", elsewhere, "elsewhere", "data", named, "other-node"},
		{"a pod whose spec does not name the volume", unrelated, "unrelated", "data", named, "ident-vol"},
	} {
		dir := f.podDir(tc.uid, tc.volName)
		opts := map[string]string{flex.OptPodNamespace: "default"}
		for k, v := range tc.opts {
			opts[k] = v
		}
		uidOpt := tc.uid
		if u, ok := opts[flex.OptPodUID]; ok {
			uidOpt = u
			delete(opts, flex.OptPodUID)
		}
		res, _ := f.run(t, "mount", dir, optionsWith(t, tc.pod, uidOpt, tc.volName, opts))
		want(t, tc.name, res, flex.StatusFailure)
		if !strings.Contains(res.Message, tc.says) {
			t.Errorf("%s: refusal does not say %q: %s", tc.name, tc.says, res.Message)
		}
		if mounted(t, dir) || loops(t, image) != 0 {
			t.Errorf("%s: refused mount left: mounted %t, loop devices %d", tc.name, mounted(t, dir), loops(t, image))
		}
		if err := f.env.Client.Get(ctx, client.ObjectKey{Name: "ident-vol"}, &v1.Attachment{}); !apierrors.IsNotFound(err) {
			t.Errorf("%s: refused mount left an Attachment (%v)", tc.name, err)
		}
	}

	// A mount dir that is not kubelet's shape for this driver.
	for _, dir := range []string{
		f.podDir(victim, "data") + "/../../../../" + victim + "/volumes/berth.io~berth/data",
		f.dir + "/elsewhere/pods/" + victim + "/volumes/berth.io~berth/data",
	} {
		res, _ := f.run(t, "mount", dir, optionsWith(t, "victim", victim, "data", named))
		want(t, "mount at "+dir, res, flex.StatusFailure)
		if loops(t, image) != 0 {
			t.Errorf("mount at %s left a loop device", dir)
		}
	}

	// The victim's own, consistent call mounts, and records the pod.
	dir := f.podDir(victim, "data")
	res, _ := f.run(t, "mount", dir, optionsWith(t, "victim", victim, "data", named))
	want(t, "consistent mount", res, flex.StatusSuccess)
	att := &v1.Attachment{}
	if err := f.env.Client.Get(ctx, client.ObjectKey{Name: "ident-vol"}, att); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range att.Spec.Attachments {
		found = found || (e.PodNamespace == "default" && e.Pod == "victim" && e.PodUID == victim && e.MountDir == dir)
	}
	if !found || !mounted(t, dir) {
		t.Errorf("consistent mount: mounted %t, entries %+v", mounted(t, dir), att.Spec.Attachments)
	}
	res, _ = f.run(t, "unmount", dir)
	want(t, "unmount", res, flex.StatusSuccess)
}
