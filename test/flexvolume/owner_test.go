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

// pv makes a PersistentVolume bound (by claimRef) to a claim in ns.
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
}
