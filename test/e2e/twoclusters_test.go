//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// testTwoStorageClustersOneDeleted: a second StorageCluster with its own
// data dir works beside berth, served by the same node-wide agent, keeper,
// CSI controller and CSIDriver. With a pod on a volume of each on one node,
// both writing, deleting the second cluster (cleanup policy Detach)
// detaches its volume, and the first cluster's pod (a userspace volume,
// held by the keeper) keeps writing and reading; the keeper pods, the
// CSIDriver and the agent stay. The second cluster's image lived in its own
// data dir and goes when its claim does.
func testTwoStorageClustersOneDeleted(t *testing.T) {
	s := newScenario(t, 12*time.Minute)
	keepers := s.podUIDs("app.kubernetes.io/name=berth,app.kubernetes.io/component=keeper")
	driver, err := s.cs.StorageV1().CSIDrivers().Get(s.ctx, "berth.io", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := s.storageCluster("second", "")
	// The agent rolls out with the second data dir; both clusters Ready.
	s.waitClustersReady(4*time.Minute, "second", "berth")
	s.waitFor("the class of second", time.Minute, func(ctx context.Context) (bool, error) {
		cls, err := s.cs.StorageV1().StorageClasses().Get(ctx, "second", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil && cls.Parameters["storageCluster"] == "second", err
	})

	s.pvc("first", "berth-userspace", "64Mi", corev1.ReadWriteOnce, false)
	s.pvc("other", "second", "32Mi", corev1.ReadWriteOnce, false)
	firstPV := s.boundPV("first")
	otherPV := s.boundPV("other")
	image := filepath.Join(dir, "volumes", otherPV.Spec.CSI.VolumeHandle+".img")
	if _, err := os.Stat(image); err != nil {
		t.Fatalf("the second cluster's image is not in its data dir: %v", err)
	}
	s.pod("writer-first", appendingWriter, claimSource("first"), false)
	s.pod("writer-other", `while true; do date >> /data/log; sleep 0.2; done`, claimSource("other"), false)
	s.running("writer-first")
	s.running("writer-other")
	s.waitFor("both writing", time.Minute, func(context.Context) (bool, error) {
		out, err := s.exec("writer-other", "wc -l < /data/log")
		return err == nil && strings.TrimSpace(out) != "0" && s.logLines("writer-first") > 5, nil
	})

	// Gone once its volume is detached on the node.
	s.deleteStorageCluster("second")
	if m := s.nodeMounts(otherPV.Name); len(m) > 0 {
		t.Errorf("the deleted cluster's volume is still mounted: %v", m)
	}
	// unharmed: the first cluster's writer goes on writing without an
	// error or a restart, and the keepers are the same pods.
	unharmed := func(after string, timeout time.Duration) {
		t.Helper()
		s.writerUnharmed("writer-first", after, timeout)
		if now := s.podUIDs("app.kubernetes.io/name=berth,app.kubernetes.io/component=keeper"); !sameUIDs(keepers, now) {
			t.Errorf("keeper pods changed %s: %v -> %v", after, keepers, now)
		}
	}
	unharmed("after the deletion", time.Minute)
	if out, err := s.exec("writer-first", "echo still-here > /data/check && sync && cat /data/check"); err != nil || strings.TrimSpace(out) != "still-here" {
		t.Errorf("write and read on the first cluster's volume: %q, %v", out, err)
	}
	if len(s.nodeMounts(firstPV.Name)) == 0 {
		t.Error("the first cluster's volume is not mounted any more")
	}
	if d, err := s.cs.StorageV1().CSIDrivers().Get(s.ctx, "berth.io", metav1.GetOptions{}); err != nil || d.UID != driver.UID {
		t.Errorf("the CSIDriver changed or went: %v", err)
	}
	if len(s.podUIDs(agentPods)) == 0 {
		t.Error("no agent pods after the deletion")
	}

	// The second cluster's claim goes: its image goes from its data dir
	// (still mounted in the agent while a Volume of it remains).
	s.deletePod("writer-other")
	s.deleteClaimAndImage("other", otherPV.Name, image)
	s.waitAgentWithout(dir)
	// That rollout restarted the agent under the userspace volume: healed,
	// the writer never saw an error.
	unharmed("after the agent rollout", 2*time.Minute)
}

// podUIDs returns the UIDs of berth's pods matching selector.
func (s *scenario) podUIDs(selector string) []types.UID {
	s.t.Helper()
	list, err := s.cs.CoreV1().Pods(berthNamespace).List(s.ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		s.t.Fatal(err)
	}
	var uids []types.UID
	for _, p := range list.Items {
		uids = append(uids, p.UID)
	}
	return uids
}

func sameUIDs(a, b []types.UID) bool {
	if len(a) != len(b) {
		return false
	}
	seen := map[types.UID]bool{}
	for _, u := range a {
		seen[u] = true
	}
	for _, u := range b {
		if !seen[u] {
			return false
		}
	}
	return true
}
