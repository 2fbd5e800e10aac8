package dev

import (
	"encoding/json"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestConsumersLeaveAddonsAlone: down deletes the pods that may hold a berth
// volume before berth goes, and only those. A cluster addon's pod (the
// snapshot-controller in kube-system) holds none; deleting it made its
// ReplicaSet bring it back, and down waited for it until its timeout.
func TestConsumersLeaveAddonsAlone(t *testing.T) {
	pod := func(ns, name string, vols ...corev1.VolumeSource) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		for _, v := range vols {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "v", VolumeSource: v})
		}
		return p
	}
	token := corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}
	list := corev1.PodList{Items: []corev1.Pod{
		pod("kube-system", "snapshot-controller-abc", token),
		pod("kube-system", "coredns-xyz", token, corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{}}),
		pod(Namespace, "berth-agent-1", corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/run/berth"}}),
		pod("e2e-1", "writer", token, corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}),
		pod("e2e-1", "empty", corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}),
		pod("e2e-2", "flex", corev1.VolumeSource{FlexVolume: &corev1.FlexVolumeSource{Driver: "berth.io/berth"}}),
		pod("e2e-2", "inline", corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: "berth.io"}}),
		pod("e2e-3", "eph", corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{}}),
	}}
	raw, err := json.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	got, err := consumers(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"e2e-1": {"writer"}, "e2e-2": {"flex", "inline"}, "e2e-3": {"eph"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("consumers %v, want %v", got, want)
	}
	if _, err := consumers([]byte("not json")); err == nil {
		t.Error("a broken pod list gave no error")
	}
}
