//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// holdFinalizer keeps the deleted StorageCluster visible until the test has
// seen the node report itself cleaned.
const holdFinalizer = "e2e.berth.io/hold"

// Scenario 7: deleting the StorageCluster cleans the node: the agent
// force-detaches the cluster's volumes, even in use, and reports the node
// in status.cleanedNodes. The file's name makes it run last; the cluster
// is recreated at the end.
func TestStorageClusterDeletionCleansNode(t *testing.T) {
	s := newScenario(t, 6*time.Minute)
	s.pvc("held", "berth", "32Mi", corev1.ReadWriteOnce, false)
	pv := s.boundPV("held")
	pod := s.pod("held", "exec sleep 3600", claimSource("held"), false)
	s.running(pod.Name)
	if len(hostMounts(pv.Name)) == 0 {
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
	recreate, err := json.Marshal(map[string]any{
		"apiVersion": "berth.io/v1alpha1", "kind": "StorageCluster",
		"metadata": map[string]any{"name": "berth"}, "spec": sc.Spec,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.restoreStorageCluster(string(recreate)) })

	s.setFinalizers(append(slices.Clone(sc.Metadata.Finalizers), holdFinalizer))
	if _, err := s.kubectl("delete", "storagecluster", "berth", "--wait=false"); err != nil {
		t.Fatal(err)
	}
	s.waitFor("the node in status.cleanedNodes", 2*time.Minute, func(context.Context) (bool, error) {
		out, err := s.kubectl("get", "storagecluster", "berth", "-o", "jsonpath={.status.cleanedNodes}")
		return err == nil && strings.Contains(out, s.env.NodeName), nil
	})
	if m := hostMounts(pv.Name); len(m) > 0 {
		t.Fatalf("mounts of the volume left after cleanup: %v", m)
	}
}

// setFinalizers replaces the StorageCluster's finalizers.
func (s *scenario) setFinalizers(f []string) {
	s.t.Helper()
	patch, _ := json.Marshal([]map[string]any{{"op": "replace", "path": "/metadata/finalizers", "value": f}})
	if len(f) == 0 {
		patch = []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`)
	}
	if _, err := s.kubectl("patch", "storagecluster", "berth", "--type=json", "-p", string(patch)); err != nil {
		// "replace" needs the field; "add" makes it.
		patch = []byte(strings.Replace(string(patch), `"replace"`, `"add"`, 1))
		if _, err2 := s.kubectl("patch", "storagecluster", "berth", "--type=json", "-p", string(patch)); err2 != nil {
			s.t.Fatalf("set finalizers %v: %v; %v", f, err, err2)
		}
	}
}

// restoreStorageCluster lifts the test's finalizer and creates the cluster
// again, for whatever runs after.
func (s *scenario) restoreStorageCluster(manifest string) {
	out, err := s.kubectl("get", "storagecluster", "berth", "-o", "json")
	if err == nil {
		var sc struct {
			Metadata struct {
				Finalizers []string `json:"finalizers"`
			} `json:"metadata"`
		}
		if json.Unmarshal([]byte(out), &sc) == nil && slices.Contains(sc.Metadata.Finalizers, holdFinalizer) {
			s.setFinalizers(slices.DeleteFunc(sc.Metadata.Finalizers, func(f string) bool { return f == holdFinalizer }))
		}
	}
	s.waitFor("the old StorageCluster gone", 2*time.Minute, func(context.Context) (bool, error) {
		out, err := s.kubectl("get", "storagecluster", "berth", "--ignore-not-found", "-o", "name")
		return err == nil && strings.TrimSpace(out) == "", nil
	})
	if _, err := s.kubectlIn(manifest, "apply", "-f", "-"); err != nil {
		s.t.Errorf("recreate the StorageCluster: %v", err)
	}
}
