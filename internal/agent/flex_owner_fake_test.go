package agent

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/flexvolume"
)

// A Volume's PV grants its claim's namespace inline Flexvolume use only
// while it is bound: a Released PV (claim deleted, Retain policy) keeps
// its claimRef, and its old namespace must lose the volume with the claim
// (F24). The same holds for a Flexvolume PV naming the volume.
func TestFlexOwnersOnlyBoundClaims(t *testing.T) {
	vol := &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-1"}}
	csiPV := func(phase corev1.PersistentVolumePhase) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: "pvc-1"},
			Spec: corev1.PersistentVolumeSpec{
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: v1.DriverName, VolumeHandle: "pvc-1"}},
				ClaimRef:               &corev1.ObjectReference{Namespace: "team-a", Name: "data"},
			},
			Status: corev1.PersistentVolumeStatus{Phase: phase},
		}
	}
	flexPV := func(phase corev1.PersistentVolumePhase) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: "flex-pv"},
			Spec: corev1.PersistentVolumeSpec{
				PersistentVolumeSource: corev1.PersistentVolumeSource{FlexVolume: &corev1.FlexPersistentVolumeSource{
					Driver: flexDriver, Options: map[string]string{flexvolume.OptVolume: "pvc-1"}}},
				ClaimRef: &corev1.ObjectReference{Namespace: "team-b", Name: "legacy"},
			},
			Status: corev1.PersistentVolumeStatus{Phase: phase},
		}
	}
	for _, c := range []struct {
		name  string
		pvs   []*corev1.PersistentVolume
		owner []string
	}{
		{"bound CSI PV", []*corev1.PersistentVolume{csiPV(corev1.VolumeBound)}, []string{"team-a"}},
		{"released CSI PV", []*corev1.PersistentVolume{csiPV(corev1.VolumeReleased)}, nil},
		{"bound Flexvolume PV", []*corev1.PersistentVolume{csiPV(corev1.VolumeReleased), flexPV(corev1.VolumeBound)}, []string{"team-b"}},
		{"released Flexvolume PV", []*corev1.PersistentVolume{csiPV(corev1.VolumeReleased), flexPV(corev1.VolumeReleased)}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := fakeAPI(t)
			for _, pv := range c.pvs {
				b = b.WithObjects(pv).WithStatusSubresource(pv)
			}
			a := newTestAgent(t, Config{API: b.Build()})
			got, err := a.flexOwners(t.Context(), vol, "flex-pv")
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, c.owner) {
				t.Errorf("owners %v, want %v", got, c.owner)
			}
		})
	}
}
