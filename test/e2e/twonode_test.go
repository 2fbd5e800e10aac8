//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Scenario 8 (two nodes): a ReadWriteOnce claim in use by a pod on node A.
// A second pod of the same claim pinned to node B is refused: the claim's
// volume lives on node A (the local backend keeps an image on its node),
// so the scheduler never places it (the PV's node affinity). Reached
// through a PV without node affinity (as an admin could write one), berth's
// agent on node B refuses it, and the kubelet's Event names the pod that
// holds it on node A.
func testReadWriteOnceRefusedOnSecondNode(t *testing.T) {
	s := newScenario(t, 5*time.Minute)
	nodes := s.env.twoNodes(t)
	nodeA, nodeB := nodes[0], nodes[1]
	s.pvc("rwo", "berth", "32Mi", corev1.ReadWriteOnce, false)
	pv := s.boundPV("rwo")
	holder := s.pod("holder", "exec sleep 3600", claimSource("rwo"), false)
	s.running(holder.Name)

	// The same claim on node B: unschedulable, and the scheduler says why.
	s.podOn(nodeB, "same-claim", claimSource("rwo"))
	s.waitEvents(s.ns, "Pod", "same-claim", time.Minute, "didn't match PersistentVolume's node affinity")

	// The same volume through a PV without node affinity: berth refuses.
	static := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pv.Name + "-static"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      pv.Spec.Capacity,
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			ClaimRef:                      &corev1.ObjectReference{Namespace: s.ns, Name: "static"},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: pv.Spec.CSI.Driver, VolumeHandle: pv.Spec.CSI.VolumeHandle,
				FSType: pv.Spec.CSI.FSType, VolumeAttributes: pv.Spec.CSI.VolumeAttributes,
			}},
		},
	}
	if _, err := s.cs.CoreV1().PersistentVolumes().Create(s.ctx, static, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create PV %s: %v", static.Name, err)
	}
	t.Cleanup(func() {
		// Retain: deleting it never deletes the volume; it goes with its claim.
		_ = s.cs.CoreV1().PersistentVolumes().Delete(context.Background(), static.Name, metav1.DeleteOptions{})
	})
	empty := ""
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "static"},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &empty, VolumeName: static.Name,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: pv.Spec.Capacity},
		},
	}
	if _, err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Create(s.ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create PVC static: %v", err)
	}
	s.boundPV("static")
	s.podOn(nodeB, "intruder", claimSource("static"))
	// berth's Event on the intruder names the holder.
	s.waitEvents(s.ns, "Pod", "intruder", 2*time.Minute, "pod "+s.ns+"/holder", "on node "+nodeA, nodeB)
	for _, name := range []string{"same-claim", "intruder"} {
		p, err := s.cs.CoreV1().Pods(s.ns).Get(s.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase != corev1.PodPending {
			t.Errorf("pod %s is %s, want Pending", name, p.Status.Phase)
		}
	}
	if got, err := s.exec(holder.Name, "echo ok > /data/f && cat /data/f"); err != nil || strings.TrimSpace(got) != "ok" {
		t.Fatalf("the holder cannot write any more: %q %v", got, err)
	}
}

// podOn creates a pod that sleeps with vol at /data, pinned to node.
func (s *scenario) podOn(node, name string, vol corev1.VolumeSource) {
	s.t.Helper()
	saved := s.node
	s.node = node
	defer func() { s.node = saved }()
	s.pod(name, "exec sleep 3600", vol, false)
}
