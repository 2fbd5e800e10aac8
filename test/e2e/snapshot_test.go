//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// snapshotClass is the VolumeSnapshotClass the operator makes where the
// cluster serves the snapshot API (hack/cluster installs it).
const snapshotClass = "berth"

// Scenario 8: snapshots through Kubernetes, as a user takes them with
// kubectl: a pod writes to a claim; a VolumeSnapshot of the claim, in use,
// turns readyToUse; a later write to the claim does not reach the snapshot;
// a new claim restored from it (dataSource) gives a pod the data of the
// moment of the snapshot. For both mounters.
func testSnapshotRestore(t *testing.T) {
	for _, class := range []string{"berth", "berth-userspace"} {
		t.Run(class, func(t *testing.T) { snapshotRestore(t, class) })
	}
}

func snapshotRestore(t *testing.T, class string) {
	s := newScenario(t, 6*time.Minute)
	s.needSnapshotAPI()
	t.Cleanup(func() {
		if t.Failed() {
			out, err := s.kubectl("-n", s.ns, "get", "volumesnapshots,volumesnapshotcontents", "-o", "yaml")
			t.Logf("$ kubectl get volumesnapshots,volumesnapshotcontents -o yaml\n%s%v", out, errOrEmpty(err))
			out, err = s.kubectl("-n", "kube-system", "logs", "--tail=40", "deploy/snapshot-controller")
			t.Logf("$ kubectl -n kube-system logs deploy/snapshot-controller\n%s%v", out, errOrEmpty(err))
		}
	})

	s.pvc("src", class, "64Mi", corev1.ReadWriteOnce, false)
	s.boundPV("src")
	before := fmt.Sprintf("before-%d", time.Now().UnixNano())
	s.pod("writer", "echo "+before+" > /data/f && sync && exec sleep 3600", claimSource("src"), false)
	s.running("writer")
	s.waitFor("the writer's data", time.Minute, func(context.Context) (bool, error) {
		got, err := s.exec("writer", "cat /data/f")
		return err == nil && strings.TrimSpace(got) == before, nil
	})

	s.createSnapshot("snap", snapshotClass, "src")
	var size string
	s.waitFor("VolumeSnapshot readyToUse", 3*time.Minute, func(context.Context) (bool, error) {
		out, err := s.kubectl("-n", s.ns, "get", "volumesnapshot", "snap", "-o",
			"jsonpath={.status.readyToUse} {.status.restoreSize} {.status.error.message}")
		if err != nil {
			return false, nil
		}
		f := strings.Fields(out)
		if len(f) > 2 {
			t.Logf("VolumeSnapshot error: %s", strings.Join(f[2:], " "))
		}
		if len(f) > 1 {
			size = f[1]
		}
		return len(f) > 0 && f[0] == "true", nil
	})
	if q, err := resource.ParseQuantity(size); err != nil || q.Cmp(resource.MustParse("64Mi")) < 0 {
		t.Errorf("restoreSize %q (%v), want at least 64Mi", size, err)
	}
	// Written after the snapshot: the restore must not have it.
	if _, err := s.exec("writer", "echo after > /data/f && sync"); err != nil {
		t.Fatalf("write after the snapshot: %v", err)
	}

	s.restoredPVC("restored", class, "snap", "64Mi")
	s.boundPV("restored")
	s.pod("reader", "exec sleep 3600", claimSource("restored"), false)
	s.running("reader")
	got, err := s.exec("reader", "cat /data/f")
	if err != nil || strings.TrimSpace(got) != before {
		t.Fatalf("restored claim holds %q (%v), want %q", got, err, before)
	}
}

// needSnapshotAPI fails (skips, where the cluster was brought up without it
// on purpose) when the cluster serves no VolumeSnapshot API or has no berth
// VolumeSnapshotClass.
func (s *scenario) needSnapshotAPI() {
	s.t.Helper()
	out, err := s.kubectl("get", "volumesnapshotclass", snapshotClass, "-o", "jsonpath={.driver} {.deletionPolicy}")
	if err == nil {
		if strings.TrimSpace(out) != "berth.io Delete" {
			s.t.Fatalf("VolumeSnapshotClass %s: driver and deletionPolicy %q, want berth.io Delete", snapshotClass, out)
		}
		return
	}
	if os.Getenv("BERTH_E2E_SNAPSHOTS") == "0" {
		s.t.Skipf("BERTH_E2E_SNAPSHOTS=0: the cluster has no VolumeSnapshot API (%v)", err)
	}
	s.t.Fatalf("no VolumeSnapshotClass %s (hack/cluster/snapshots.sh installs the API, the operator the class): %v", snapshotClass, err)
}

// restoredPVC creates a claim of class restored from VolumeSnapshot snap.
func (s *scenario) restoredPVC(name, class, snap, size string) {
	s.t.Helper()
	fs := corev1.PersistentVolumeFilesystem
	c := &corev1.PersistentVolumeClaim{
		// As pvc: the node picked as the scheduler would, the snapshot's.
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{selectedNodeAnnotation: s.env.NodeName}},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &class, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, VolumeMode: &fs,
			DataSource: &corev1.TypedLocalObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: snap},
			Resources:  corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
		},
	}
	if _, err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Create(s.ctx, c, metav1.CreateOptions{}); err != nil {
		s.t.Fatalf("create PVC %s from snapshot %s: %v", name, snap, err)
	}
}
