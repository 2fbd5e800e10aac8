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
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

// imagePath is where the agent keeps the image of volume handle on the
// scenario's node (its BERTH_DATA_DIR), seen from the host.
func (s *scenario) imagePath(handle string) string {
	s.t.Helper()
	p, err := s.env.NodePath(s.node, "berth-data", "volumes", handle+".img")
	if err != nil {
		s.t.Fatal(err)
	}
	return p
}

// Scenario 1: a dynamically provisioned PVC; a pod writes and reads back;
// deleting the pod unpublishes and unstages; deleting the PVC removes the
// PV, the Volume and the image.
func testDynamicPVCLifecycle(t *testing.T) {
	s := newScenario(t, 6*time.Minute)
	s.pvc("data", "berth", "64Mi", corev1.ReadWriteOnce, false)
	pv := s.boundPV("data")
	handle := pv.Spec.CSI.VolumeHandle
	if _, err := os.Stat(s.imagePath(handle)); err != nil {
		t.Fatalf("volume %s has no image on the node: %v", handle, err)
	}
	token := fmt.Sprintf("berth-%d", time.Now().UnixNano())
	pod := s.pod("writer", "echo "+token+" > /data/f && sync && exec sleep 3600", claimSource("data"), false)
	s.running(pod.Name)
	got, err := s.exec(pod.Name, "cat /data/f")
	if err != nil || strings.TrimSpace(got) != token {
		t.Fatalf("read back %q (%v), want %q", got, err, token)
	}
	if m := s.nodeMounts(pv.Name, string(pod.UID)); len(m) == 0 {
		t.Fatalf("no mount of %s on the node while the pod runs", pv.Name)
	}

	s.deletePod(pod.Name)
	// kubelet unpublishes and then unstages: nothing of the PV stays mounted.
	s.waitFor("unpublish and unstage", time.Minute, func(context.Context) (bool, error) {
		return len(s.nodeMounts(pv.Name, string(pod.UID))) == 0, nil
	})

	if err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Delete(s.ctx, "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitFor("PV, Volume and image gone", 2*time.Minute, func(ctx context.Context) (bool, error) {
		_, err := s.cs.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return false, nil
		}
		if out, _ := s.kubectl("get", "volumes.berth.io", handle, "--ignore-not-found", "-o", "name"); strings.TrimSpace(out) != "" {
			return false, nil
		}
		_, err = os.Stat(s.imagePath(handle))
		return os.IsNotExist(err), nil
	})
}

// Scenario 2: a ReadWriteOncePod claim in use keeps a second pod pending,
// with an event that says why.
func testReadWriteOncePodRefusesSecondPod(t *testing.T) {
	s := newScenario(t, 5*time.Minute)
	s.pvc("once", "berth", "32Mi", corev1.ReadWriteOncePod, false)
	s.boundPV("once")
	s.pod("first", "exec sleep 3600", claimSource("once"), false)
	s.running("first")
	s.pod("second", "exec sleep 3600", claimSource("once"), false)
	s.waitEvents(s.ns, "Pod", "second", time.Minute, "ReadWriteOncePod")
	p, err := s.cs.CoreV1().Pods(s.ns).Get(s.ctx, "second", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" {
		t.Fatalf("second pod phase %s on node %q, want Pending and unscheduled", p.Status.Phase, p.Spec.NodeName)
	}
}

// Scenario 3: a block-mode claim used raw by a pod.
func testBlockModePVC(t *testing.T) {
	s := newScenario(t, 5*time.Minute)
	s.pvc("raw", "berth", "32Mi", corev1.ReadWriteOnce, true)
	s.boundPV("raw")
	s.pod("raw", "exec sleep 3600", claimSource("raw"), true)
	s.running("raw")
	token := fmt.Sprintf("berth-block-%d", time.Now().UnixNano())
	script := fmt.Sprintf("test -b /dev/xvda && printf %s | dd of=/dev/xvda bs=512 conv=sync,fsync 2>/dev/null && "+
		"dd if=/dev/xvda bs=512 count=1 2>/dev/null | head -c %d", token, len(token))
	got, err := s.exec("raw", script)
	if err != nil || got != token {
		t.Fatalf("raw device read back %q (%v), want %q", got, err, token)
	}
}

// Scenario 4: online expansion of a mounted claim, seen inside the pod. xfs
// grows online without CAP_SYS_RESOURCE, which ext4's resize needs and
// this machine lacks.
func testOnlineExpansion(t *testing.T) {
	withXFSClass(t) // first, so that its removal comes after the namespace's
	s := newScenario(t, 6*time.Minute)
	s.pvc("grow", xfsClass, "320Mi", corev1.ReadWriteOnce, false)
	s.boundPV("grow")
	s.pod("grow", "exec sleep 3600", claimSource("grow"), false)
	s.running("grow")
	before := s.dfKiB("grow")
	patch := []byte(`{"spec":{"resources":{"requests":{"storage":"640Mi"}}}}`)
	if _, err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Patch(s.ctx, "grow", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("expand PVC: %v", err)
	}
	var after int64
	s.waitFor("the pod to see the larger filesystem", 3*time.Minute, func(ctx context.Context) (bool, error) {
		size, err := s.tryDfKiB("grow")
		if err != nil {
			s.t.Logf("%v; trying again", err)
			return false, nil
		}
		after = size
		return after > before+200*1024, nil
	})
	s.waitFor("PVC capacity 640Mi", time.Minute, func(ctx context.Context) (bool, error) {
		c, err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, "grow", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		q := c.Status.Capacity[corev1.ResourceStorage]
		return q.Cmp(resource.MustParse("640Mi")) >= 0, nil
	})
	t.Logf("filesystem in the pod: %d KiB -> %d KiB", before, after)
}

// dfKiB is the size of /data inside the pod, in KiB.
func (s *scenario) dfKiB(pod string) int64 {
	s.t.Helper()
	size, err := s.tryDfKiB(pod)
	if err != nil {
		s.t.Fatal(err)
	}
	return size
}

// tryDfKiB is dfKiB for a wait loop: an exec that comes back empty (seen
// once in CI while the volume grew) is tried again, not a failure.
func (s *scenario) tryDfKiB(pod string) (int64, error) {
	out, err := s.exec(pod, "df -k /data | tail -n 1")
	if err != nil {
		return 0, fmt.Errorf("df in %s: %w", pod, err)
	}
	var fs string
	var size int64
	if _, err := fmt.Sscan(out, &fs, &size); err != nil {
		return 0, fmt.Errorf("df output %q: %w", out, err)
	}
	return size, nil
}

// xfsClass is the StorageClass of scenario 4: the operator makes only the
// ext4 classes.
const xfsClass = "berth-xfs"

// withXFSClass creates the xfs StorageClass (or finds it); at the end it
// waits for the class's volumes to go, then removes it.
func withXFSClass(t *testing.T) {
	t.Helper()
	_, cs := needCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cls := &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{Name: xfsClass},
		Provisioner:          "berth.io",
		Parameters:           map[string]string{"csi.storage.k8s.io/fstype": "xfs", "storageCluster": "berth"},
		ReclaimPolicy:        ptr.To(corev1.PersistentVolumeReclaimDelete),
		VolumeBindingMode:    ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
		AllowVolumeExpansion: ptr.To(true),
	}
	if _, err := cs.StorageV1().StorageClasses().Create(ctx, cls, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create StorageClass %s: %v", xfsClass, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			pvs, err := cs.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			for _, pv := range pvs.Items {
				if pv.Spec.StorageClassName == xfsClass {
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil {
			t.Errorf("volumes of %s still there: %v", xfsClass, err)
		}
		if err := cs.StorageV1().StorageClasses().Delete(ctx, xfsClass, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete StorageClass %s: %v", xfsClass, err)
		}
	})
}
