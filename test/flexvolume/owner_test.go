package flexvolume

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	flex "github.com/berth-io/berth/internal/flexvolume"
)

// TestMountOnlyVolumesOfThePodsNamespace: an inline flexVolume may name only
// a Volume its pod's namespace owns (by label, or through a bound CSI or
// Flexvolume PersistentVolume); any other is refused, naming the pod's
// namespace and the volume, with no mount, loop device or Attachment made.
func TestMountOnlyVolumesOfThePodsNamespace(t *testing.T) {
	f := setup(t)
	labeled := f.volumeOf(t, "flex", "team-a-vol", v1.ReadWriteOnce, "team-a")
	byCSIPV := f.volumeOf(t, "flex", "pvc-owned", v1.ReadWriteOnce, "")
	byFlexPV := f.volumeOf(t, "flex", "flex-pv-vol", v1.ReadWriteOnce, "")
	orphan := f.volumeOf(t, "flex", "nobodys-vol", v1.ReadWriteOnce, "")
	f.pv(t, "pvc-owned", "team-b", &corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: v1.DriverName, VolumeHandle: "pvc-owned"}})
	f.pv(t, "flex-pv", "team-c", &corev1.PersistentVolumeSource{FlexVolume: &corev1.FlexPersistentVolumeSource{
		Driver: "berth.io/berth", Options: map[string]string{flex.OptVolume: "flex-pv-vol"}}})

	for i, tc := range []struct {
		name, volume, image, ns string
		podVolume               string // the pod's (inline) volume name
	}{
		{"labeled for another namespace", "team-a-vol", labeled, "default", "v"},
		{"claimed by another namespace", "pvc-owned", byCSIPV, "team-a", "v"},
		{"inline, named after another namespace's PV", "flex-pv-vol", byFlexPV, "team-a", "flex-pv"},
		{"owned by no namespace", "nobodys-vol", orphan, "default", "v"},
	} {
		pod := fmt.Sprintf("intruder-%d", i)
		uid := f.pod(t, podSpec{ns: tc.ns, name: pod, volume: inline(tc.podVolume, tc.volume)})
		dir := f.podDir(uid, tc.podVolume)
		extra := map[string]string{flex.OptPodNamespace: tc.ns, flex.OptVolume: tc.volume}
		res, _ := f.run(t, "mount", dir, optionsWith(t, pod, uid, tc.podVolume, extra))
		want(t, tc.name, res, flex.StatusFailure)
		if !strings.Contains(res.Message, `"`+tc.ns+`"`) || !strings.Contains(res.Message, tc.volume) {
			t.Errorf("%s: refusal does not name namespace %s and volume %s: %s", tc.name, tc.ns, tc.volume, res.Message)
		}
		if mounted(t, dir) || loops(t, tc.image) != 0 {
			t.Errorf("%s: refused mount left: mounted %t, loop devices %d", tc.name, mounted(t, dir), loops(t, tc.image))
		}
		if err := f.env.Client.Get(context.Background(), client.ObjectKey{Name: tc.volume}, &v1.Attachment{}); !apierrors.IsNotFound(err) {
			t.Errorf("%s: refused mount left an Attachment (%v)", tc.name, err)
		}
	}

	// The owners may mount.
	for i, tc := range []struct {
		volume, ns string
		podVolume  corev1.Volume
		name       string // kubelet's name of the volume: the pod's, or the PV's
	}{
		{"team-a-vol", "team-a", inline("v", "team-a-vol"), "v"},
		{"pvc-owned", "team-b", inline("v", "pvc-owned"), "v"},
		// Through the claim bound to the Flexvolume PV.
		{"flex-pv-vol", "team-c", claim("data", "claim"), "flex-pv"},
	} {
		pod := fmt.Sprintf("owner-%d", i)
		uid := f.pod(t, podSpec{ns: tc.ns, name: pod, volume: tc.podVolume})
		dir := f.podDir(uid, tc.name)
		extra := map[string]string{flex.OptPodNamespace: tc.ns, flex.OptVolume: tc.volume}
		res, _ := f.run(t, "mount", dir, optionsWith(t, pod, uid, tc.name, extra))
		want(t, "mount of "+tc.volume+" by its namespace "+tc.ns, res, flex.StatusSuccess)
		res, _ = f.run(t, "unmount", dir)
		want(t, "unmount of "+tc.volume, res, flex.StatusSuccess)
	}
}

// pv makes a PersistentVolume bound (by claimRef, phase Bound, as the PV
// controller would leave it) to a claim in ns.
func (f *fixture) pv(t *testing.T, name, ns string, src *corev1.PersistentVolumeSource) {
	t.Helper()
	ctx := context.Background()
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")},
			AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: *src,
			ClaimRef:               &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: ns, Name: "claim"},
		},
	}
	if err := f.env.Client.Create(ctx, pv); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.env.Client.Delete(ctx, pv) })
	pv.Status.Phase = corev1.VolumeBound
	if err := f.env.Client.Status().Update(ctx, pv); err != nil {
		t.Fatal(err)
	}
}

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
