//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// testStorageClusterDeletionWithAgentAway: a StorageCluster (cleanup policy
// Detach, cleanupTimeout 20s) is deleted with --cascade=foreground while
// the agent is kept off the node that has its volume staged and in use.
// The deletion does not hang: it completes soon after the timeout, a
// CleanupTimedOut Event says so, and the node's entries are on its stale
// list. Once the agent is back it undoes them: no staging mount remains
// and the volume's loop device is detached (the kernel frees it when the
// pod still running on it is gone).
func testStorageClusterDeletionWithAgentAway(t *testing.T) {
	s := newScenario(t, 14*time.Minute)
	const cluster, timeout = "away", 20 * time.Second
	// Cleanups run last first: the taint (agentDown's, registered later)
	// goes before the cluster and its folder.
	dir := s.storageCluster(cluster, fmt.Sprintf("  cleanupTimeout: %s\n", timeout))
	s.waitClustersReady(4*time.Minute, cluster, "berth")
	s.waitFor("the class of "+cluster, time.Minute, func(ctx context.Context) (bool, error) {
		_, err := s.cs.StorageV1().StorageClasses().Get(ctx, cluster, metav1.GetOptions{})
		return err == nil, nil
	})
	s.pvc("claim", cluster, "32Mi", corev1.ReadWriteOnce, false)
	pv := s.boundPV("claim")
	volume := pv.Spec.CSI.VolumeHandle
	image := filepath.Join(dir, "volumes", volume+".img")
	s.pod("user", "echo hi > /data/f && sync && exec sleep 3600", claimSource("claim"), false)
	s.running("user")
	dev, staging := s.stagedOn(volume)
	if !strings.HasPrefix(dev, "/dev/loop") || staging == "" || len(s.nodeMounts(staging)) == 0 {
		t.Fatalf("volume %s: device %q, staging %q, mounts %v; want a staged loop device", volume, dev, staging, s.nodeMounts(staging))
	}
	backing := filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file")

	// The agent away from the node. The user pod keeps running on the
	// staged volume.
	s.agentDown()

	start := time.Now()
	if out, err := s.kubectl("delete", "storagecluster", cluster, "--cascade=foreground", "--wait=false"); err != nil {
		t.Fatalf("delete: %v: %s", err, out)
	}
	// The operator checks each cleanupTimeout's end on its poll; a minute
	// beyond it is plenty, the agent never coming back.
	s.waitFor("StorageCluster "+cluster+" gone without its node's agent", timeout+time.Minute, func(context.Context) (bool, error) {
		out, err := s.kubectl("get", "storagecluster", cluster, "--ignore-not-found", "-o", "name")
		return err == nil && strings.TrimSpace(out) == "", nil
	})
	// deletionTimestamp has whole seconds: the operator's wait may end up
	// to a second before ours.
	if took := time.Since(start); took < timeout-2*time.Second {
		t.Errorf("deletion took %v, less than the cleanupTimeout %v: it did not wait for the node", took, timeout)
	}
	if evs := strings.Join(s.clusterEvents("StorageCluster", cluster), "\n"); !strings.Contains(evs, "CleanupTimedOut") || !strings.Contains(evs, s.node) {
		t.Errorf("StorageCluster %s events %q: want CleanupTimedOut naming %s", cluster, evs, s.node)
	}
	entries := s.staleEntries(volume)
	if len(entries) == 0 {
		t.Fatalf("no entry of %s on %s's stale list after the timeout", volume, s.node)
	}
	for _, e := range entries {
		if e.Reason != v1.ReasonClusterDeleted {
			t.Errorf("stale entry %+v: reason %s, want %s", e, e.Reason, v1.ReasonClusterDeleted)
		}
	}
	if len(s.nodeMounts(staging)) == 0 {
		t.Fatal("the staging mount went without an agent")
	}

	s.agentBack()
	// Loop devices are the kernel's, shared by every node of the test
	// cluster and whatever else runs here: the device may serve another
	// image at once; it must not serve this one.
	var left string
	defer func() {
		if t.Failed() {
			t.Logf("last seen: %s", left)
		}
	}()
	// The user pod's container still has the filesystem mounted in its
	// own mount namespace, which no unmount here reaches: the agent's
	// detach leaves the device to the kernel (autoclear), which frees it
	// once that last user is gone.
	autoclear := filepath.Join(filepath.Dir(backing), "autoclear")
	s.waitFor("the agent undid the stale entries: no staging mount, the loop device detached", 3*time.Minute, func(context.Context) (bool, error) {
		file, _ := os.ReadFile(backing)
		clear, _ := os.ReadFile(autoclear)
		entries, mounts := s.staleEntries(volume), s.nodeMounts(staging)
		left = fmt.Sprintf("entries %v, mounts %v, %s backing %q autoclear %q", entries, mounts, dev, strings.TrimSpace(string(file)), strings.TrimSpace(string(clear)))
		return len(entries) == 0 && len(mounts) == 0 && (!strings.Contains(string(file), volume) || strings.TrimSpace(string(clear)) == "1"), nil
	})
	t.Logf("after the agent's return: %s", left)
	s.deletePod("user")
	s.waitFor("the loop device freed once the pod is gone", time.Minute, func(context.Context) (bool, error) {
		file, _ := os.ReadFile(backing)
		left = fmt.Sprintf("%s backing %q", dev, strings.TrimSpace(string(file)))
		return !strings.Contains(string(file), volume), nil
	})

	// The claim of the deleted cluster still deletes its image (the data
	// dir stays mounted in the agent while a Volume of it remains), and
	// the agent then rolls out without that data dir.
	s.deleteClaimAndImage("claim", pv.Name, image)
	s.waitAgentWithout(dir)
}

// staleEntries returns the entries of volume on the scenario node's stale
// list (none when the list is gone).
func (s *scenario) staleEntries(volume string) []v1.StaleAttachment {
	s.t.Helper()
	out, err := s.kubectl("get", "nodecleanups.berth.io", s.node, "--ignore-not-found", "-o", "json")
	if err != nil {
		s.t.Fatalf("stale list of %s: %v: %s", s.node, err, out)
	}
	if strings.TrimSpace(out) == "" {
		return nil
	}
	var nc v1.NodeCleanup
	if err := json.Unmarshal([]byte(out), &nc); err != nil {
		s.t.Fatalf("stale list of %s: %v", s.node, err)
	}
	var mine []v1.StaleAttachment
	for _, e := range nc.Spec.Entries {
		if e.Volume == volume {
			mine = append(mine, e)
		}
	}
	return mine
}
