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
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{NodeName: "n1"}}
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
	got, stranded, err := consumers(raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"e2e-1": {"writer"}, "e2e-2": {"flex", "inline"}, "e2e-3": {"eph"}}
	if !reflect.DeepEqual(got, want) || len(stranded) != 0 {
		t.Errorf("consumers %v, stranded %v; want %v and none", got, stranded, want)
	}
	if _, _, err := consumers([]byte("not json"), nil); err == nil {
		t.Error("a broken pod list gave no error")
	}
}

// TestConsumersOnLostNodes: a consumer on a node that is not Ready (a VM
// node that died) is stranded, and down force-deletes it rather than wait
// for a kubelet that never answers (five minutes in a failed CI run).
func TestConsumersOnLostNodes(t *testing.T) {
	claim := corev1.Volume{Name: "v", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}}
	pod := func(name, node string) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "e2e", Name: name},
			Spec: corev1.PodSpec{NodeName: node, Volumes: []corev1.Volume{claim}}}
	}
	node := func(name string, ready corev1.ConditionStatus) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse},
			{Type: corev1.NodeReady, Status: ready, Message: "Kubelet stopped posting node status."},
		}}}
	}
	nodes, err := json.Marshal(corev1.NodeList{Items: []corev1.Node{
		node("n1", corev1.ConditionTrue), node("n2", corev1.ConditionUnknown), {ObjectMeta: metav1.ObjectMeta{Name: "n3"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	lost, err := lostNodes(nodes)
	if err != nil {
		t.Fatal(err)
	}
	wantLost := map[string]string{"n2": "Ready=Unknown: Kubelet stopped posting node status.", "n3": "no Ready condition"}
	if !reflect.DeepEqual(lost, wantLost) {
		t.Errorf("lost %v, want %v", lost, wantLost)
	}
	pods, err := json.Marshal(corev1.PodList{Items: []corev1.Pod{pod("a", "n1"), pod("b", "n2"), pod("c", "n3"), pod("d", "")}})
	if err != nil {
		t.Fatal(err)
	}
	found, stranded, err := consumers(pods, lost)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string][]string{"e2e": {"a", "b", "c", "d"}}; !reflect.DeepEqual(found, want) {
		t.Errorf("found %v, want %v", found, want)
	}
	if want := map[string][]string{"e2e": {"b", "c"}}; !reflect.DeepEqual(stranded, want) {
		t.Errorf("stranded %v, want %v", stranded, want)
	}
	if _, err := lostNodes([]byte("[")); err == nil {
		t.Error("a broken node list gave no error")
	}
}
