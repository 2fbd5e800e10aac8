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

	"github.com/berth-io/berth/internal/cli/dev"
)

// Scenario 7: deleting the StorageCluster cleans the node: the operator's
// berth.io/cleanup finalizer holds it until the agent has force-detached
// the cluster's volumes, even in use, and reported the node cleaned. It runs
// near the end of the scenario list; the cluster is recreated at the end.
func testStorageClusterDeletionCleansNode(t *testing.T) {
	s := newScenario(t, 8*time.Minute)
	s.pvc("held", "berth", "32Mi", corev1.ReadWriteOnce, false)
	pv := s.boundPV("held")
	// The container exits once /state/stop exists; restarted, it tells
	// what it finds at /data.
	pod := s.pod("held", `if [ -e /state/stop ]; then
  if [ -d /data ]; then echo folder; else echo no-folder; fi > /state/seen
  exec sleep 3600
fi
while [ ! -e /state/stop ]; do sleep 1; done
exit 1`, claimSource("held"), false)
	s.running(pod.Name)
	if len(s.nodeMounts(pv.Name)) == 0 {
		t.Fatal("the volume is not mounted on the node")
	}

	raw, err := s.kubectl("get", "storagecluster", "berth", "-o", "json")
	if err != nil {
		t.Fatalf("the StorageCluster berth: %v", err)
	}
	var sc struct {
		Metadata struct {
			Finalizers []string `json:"finalizers"`
		} `json:"metadata"`
		Spec json.RawMessage `json:"spec"`
	}
	if err := json.Unmarshal([]byte(raw), &sc); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(sc.Metadata.Finalizers, " "), "berth.io/cleanup") {
		t.Fatalf("the StorageCluster has finalizers %v, want berth.io/cleanup", sc.Metadata.Finalizers)
	}
	recreate, err := json.Marshal(map[string]any{
		"apiVersion": "berth.io/v1alpha1", "kind": "StorageCluster",
		"metadata": map[string]any{"name": "berth"}, "spec": sc.Spec,
	})
	if err != nil {
		t.Fatal(err)
	}
	// Before the namespace's cleanup (cleanups run last first): the pod's
	// unmount needs an agent again.
	t.Cleanup(func() { s.restoreStorageCluster(string(recreate)) })

	// Its finalizer is lifted after the node's cleanup.
	s.deleteStorageCluster("berth")
	if m := s.nodeMounts(pv.Name); len(m) > 0 {
		t.Fatalf("mounts of the volume left after cleanup: %v", m)
	}
	s.restartFindsNoFolder(pod.Name)
}

// restartFindsNoFolder restarts the pod's container after its volume was
// detached under it, and fails if the new container got a folder at /data:
// one the runtime made on the node's disk, which it would write into unseen.
// The detach leaves a tombstone file there instead, so the container either
// fails to start or finds no folder.
func (s *scenario) restartFindsNoFolder(pod string) {
	s.t.Helper()
	if out, err := s.exec(pod, "touch /state/stop"); err != nil {
		s.t.Fatalf("stop the container: %v: %s", err, out)
	}
	var seen string
	s.waitFor("the restarted container to start or fail", 2*time.Minute, func(ctx context.Context) (bool, error) {
		p, err := s.cs.CoreV1().Pods(s.ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.RestartCount == 0 && c.LastTerminationState.Terminated == nil {
				continue // the first run still goes
			}
			if w := c.State.Waiting; w != nil && strings.HasSuffix(w.Reason, "ContainerError") {
				seen = "not started: " + w.Reason + ": " + w.Message
				return true, nil
			}
			if c.State.Running != nil && c.RestartCount > 0 {
				out, err := s.exec(pod, "cat /state/seen 2>/dev/null")
				seen = strings.TrimSpace(out)
				return err == nil && seen != "", nil
			}
		}
		return false, nil
	})
	s.t.Logf("restarted container after the detach: %s", seen)
	if seen == "folder" {
		s.t.Errorf("the restarted container found a folder at /data: the runtime made one on the node's disk")
	}
}

// restoreStorageCluster creates the cluster again and waits for it to be
// Ready, for whatever runs after.
func (s *scenario) restoreStorageCluster(manifest string) {
	s.waitFor("no StorageCluster berth", 3*time.Minute, func(context.Context) (bool, error) {
		out, err := s.kubectl("get", "storagecluster", "berth", "--ignore-not-found", "-o", "name")
		return err == nil && strings.TrimSpace(out) == "", nil
	})
	if _, err := s.kubectlIn(manifest, "apply", "-f", "-"); err != nil {
		s.t.Errorf("recreate the StorageCluster: %v", err)
		return
	}
	s.waitFor("the recreated StorageCluster Ready", 3*time.Minute, func(context.Context) (bool, error) {
		out, err := s.kubectl("get", "storagecluster", "berth", "-o", "jsonpath={.status.phase}")
		return err == nil && out == "Ready", nil
	})
}

// storageCluster applies a StorageCluster name (cleanup policy Detach) whose
// data dir is a folder of its own under the cluster's work dir, and returns
// that folder; spec is the rest of its spec, YAML indented as under spec.
// At the end the cluster goes, then the folder (the nodes share it: it is
// not one of their own binds).
func (s *scenario) storageCluster(name, spec string) string {
	s.t.Helper()
	t := s.t
	dir := filepath.Join(s.env.need(t, "BERTH_E2E_DIR", "the cluster's work dir"), "berth-data-"+name)
	// Cleanups run last first: the folder after the cluster.
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	t.Cleanup(func() {
		// The deletion detaches the cluster's volumes under their pods:
		// a failed test's state is logged before that.
		if t.Failed() {
			s.dump()
		}
		if out, err := s.kubectl("delete", "storagecluster", name, "--ignore-not-found", "--timeout=3m"); err != nil {
			t.Errorf("delete StorageCluster %s: %v: %s", name, err, out)
		}
	})
	manifest := fmt.Sprintf(`apiVersion: berth.io/v1alpha1
kind: StorageCluster
metadata:
  name: %s
spec:
  dataDir: %s
  cleanupPolicy: Detach
%s`, name, dir, spec)
	if !strings.Contains(spec, "rwx:") {
		// Its shares admit the probe pods, as berth dev up's clusters do.
		manifest += dev.ProbeClients(s.env.Vars)
	}
	if _, err := s.kubectlIn(manifest, "apply", "-f", "-"); err != nil {
		t.Fatalf("apply StorageCluster %s: %v", name, err)
	}
	return dir
}

// waitClustersReady waits until each StorageCluster's phase is Ready.
func (s *scenario) waitClustersReady(limit time.Duration, names ...string) {
	s.t.Helper()
	for _, name := range names {
		s.waitFor("StorageCluster "+name+" Ready", limit, func(context.Context) (bool, error) {
			out, err := s.kubectl("get", "storagecluster", name, "-o", "jsonpath={.status.phase}")
			return err == nil && out == "Ready", nil
		})
	}
}
