//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/cli/dev"
	"github.com/berth-io/berth/internal/controller/sharemanager"
	"github.com/berth-io/berth/internal/flexvolume"
)

// userRegistry is the registry name of testHelmInstallAsAUser's images:
// a user's, not berth dev's.
const userRegistry = "registry.berth.test/storage"

// testHelmInstallAsAUser: berth installed as docs/install.md tells an
// operator, with nothing of `berth dev` but the cluster's own facts
// (kubelet's folders, a data dir, the pod network for the share probe):
// berth dev's install removed as "Removing berth" says (StorageClusters,
// then helm uninstall, whose hook removes what the operator deployed); the
// image and the CSI sidecars under the user's registry name (tagged on the
// nodes, as a pull from a registry would leave them); the namespace made
// and labelled, the chart installed with image.registry and image.tag, a
// StorageCluster; a claim and a pod that writes and reads back, a
// VolumeSnapshot and a claim restored from it, an RWX claim served to a
// client; then everything deleted in the documented order and the chart
// uninstalled, leaving no berth pod, workload, Service, CSIDriver,
// StorageClass, cluster role or admission policy (the CRDs stay: Helm
// never deletes a chart's crds/). At the end berth dev's install comes
// back, with its values and StorageClusters. It runs last: it takes berth
// away for a while.
func testHelmInstallAsAUser(t *testing.T) {
	s := newScenario(t, 15*time.Minute)
	s.needBerthImage()
	u := s.newUpgrade()
	tag := imageTag(s.env.BerthImage)
	clusters := s.devStorageClusters()
	chart := filepath.Join(repoRoot(), "deploy", "berth")
	// Cleanups run last first: the user's install goes (its hook still
	// finds its image), then the image tags, then berth dev's comes back.
	var images []string
	t.Cleanup(func() { u.reinstallDev(chart, clusters) })
	t.Cleanup(func() { s.untagUserImages(images) })
	t.Cleanup(func() { s.removeUserInstall(u) })

	// Removing berth dev's install, as docs/install.md says.
	start := time.Now()
	s.noVolumesLeft()
	s.deleteStorageClusters()
	u.helm("uninstall", dev.Release, "-n", berthNamespace, "--wait", "--timeout", "5m")
	s.berthGone(berthNamespace)
	t.Logf("berth dev's install removed in %s", time.Since(start).Round(time.Second))

	// The images under the user's registry name, on every node.
	images = s.tagUserImages()

	// The install, as docs/install.md says. (berth dev made the namespace;
	// it stays, with the test Ceph's Secret.)
	start = time.Now()
	if out, err := s.kubectl("create", "namespace", berthNamespace); err != nil && !strings.Contains(out, "AlreadyExists") {
		t.Fatalf("create namespace: %v: %s", err, out)
	}
	if out, err := s.kubectl("label", "--overwrite", "namespace", berthNamespace, "pod-security.kubernetes.io/enforce=privileged"); err != nil {
		t.Fatalf("label namespace: %v: %s", err, out)
	}
	u.helm("install", dev.Release, chart, "-n", berthNamespace,
		"--set", "image.registry="+userRegistry, "--set", "image.tag="+tag, "--set", "image.pullPolicy=Never",
		// This cluster's kubelets keep their folders elsewhere.
		"--set", "kubeletDir="+s.env.KubeletRoot, "--set", "volumePluginDir="+s.env.VolumePluginDir)
	// The share probe runs in a pod, not on a workload's node: its network
	// is a client the shares admit (spec.rwx.clientCIDRs).
	sc := fmt.Sprintf("apiVersion: berth.io/v1alpha1\nkind: StorageCluster\nmetadata: {name: berth}\nspec:\n  dataDir: %s\n%s",
		s.env.need(t, "BERTH_DATA_DIR", "the data dir of the cluster's nodes"), dev.ProbeClients(s.env.Vars))
	if out, err := s.kubectlIn(sc, "apply", "-f", "-"); err != nil {
		t.Fatalf("apply the StorageCluster: %v: %s", err, out)
	}
	s.waitClustersReady(5*time.Minute, "berth")
	t.Logf("installed from the chart in %s", time.Since(start).Round(time.Second))
	s.podsRunFrom(berthNamespace, userRegistry+"/")

	// A claim and a pod that writes and reads back.
	s.pvc("data", "berth", "64Mi", corev1.ReadWriteOnce, false)
	s.boundPV("data")
	s.pod("writer", `echo written-by-the-user > /data/f && sync && exec sleep 3600`, claimSource("data"), false)
	s.running("writer")
	s.waitFor("the writer's data", time.Minute, func(context.Context) (bool, error) {
		out, err := s.exec("writer", "cat /data/f")
		return err == nil && strings.TrimSpace(out) == "written-by-the-user", nil
	})

	// A snapshot, and a claim restored from it.
	s.needSnapshotAPI()
	s.createSnapshot("snap", snapshotClass, "data")
	s.waitFor("VolumeSnapshot readyToUse", 3*time.Minute, func(context.Context) (bool, error) {
		out, err := s.kubectl("-n", s.ns, "get", "volumesnapshot", "snap", "-o", "jsonpath={.status.readyToUse}")
		return err == nil && out == "true", nil
	})
	s.restoredPVC("restored", "berth", "snap", "64Mi")
	s.boundPV("restored")
	s.pod("reader", "exec sleep 3600", claimSource("restored"), false)
	s.running("reader")
	if out, err := s.exec("reader", "cat /data/f"); err != nil || strings.TrimSpace(out) != "written-by-the-user" {
		t.Errorf("restored claim holds %q (%v), want the snapshot's data", out, err)
	}

	// An RWX claim, served to a client.
	s.pvc("shared", "berth", "64Mi", corev1.ReadWriteMany, false)
	vol := s.boundPV("shared").Spec.CSI.VolumeHandle
	s.keepShareRunning(vol)
	share := s.shareRunning(vol, "")
	if out := s.probe("probe", sharemanager.Endpoint(berthNamespace, vol)); !strings.Contains(out, "ok nfs://") {
		t.Errorf("probe of the share: %s", out)
	}

	// Everything deleted in the documented order, then uninstalled:
	// nothing of berth is left.
	start = time.Now()
	s.stopShareThenDeleteClaim(vol, share.Name, "shared")
	s.deletePod("writer")
	s.deletePod("reader")
	if out, err := s.kubectl("-n", s.ns, "delete", "volumesnapshot", "snap", "--timeout=2m"); err != nil {
		t.Fatalf("delete the VolumeSnapshot: %v: %s", err, out)
	}
	if out, err := s.kubectl("-n", s.ns, "delete", "pvc", "data", "restored", "--timeout=2m"); err != nil {
		t.Fatalf("delete the claims: %v: %s", err, out)
	}
	s.noVolumesLeft()
	s.deleteStorageClusters()
	u.helm("uninstall", dev.Release, "-n", berthNamespace, "--wait", "--timeout", "5m")
	s.berthGone(berthNamespace)
	t.Logf("deleted and uninstalled in %s: no berth pod, workload, Service, CSIDriver, StorageClass, cluster role, admission policy or Flexvolume driver left",
		time.Since(start).Round(time.Second))
}

// devStorageClusters are the cluster's StorageClusters as manifests (name,
// labels, spec), to make again after the scenario.
func (s *scenario) devStorageClusters() []string {
	s.t.Helper()
	out, err := s.kubectl("get", "storageclusters", "-o", "json")
	if err != nil {
		s.t.Fatal(err)
	}
	var list struct {
		Items []struct {
			Metadata struct {
				Name   string            `json:"name"`
				Labels map[string]string `json:"labels,omitempty"`
			} `json:"metadata"`
			Spec json.RawMessage `json:"spec"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		s.t.Fatal(err)
	}
	var manifests []string
	for _, sc := range list.Items {
		m, err := json.Marshal(map[string]any{
			"apiVersion": "berth.io/v1alpha1", "kind": "StorageCluster",
			"metadata": map[string]any{"name": sc.Metadata.Name, "labels": sc.Metadata.Labels}, "spec": sc.Spec,
		})
		if err != nil {
			s.t.Fatal(err)
		}
		manifests = append(manifests, string(m))
	}
	return manifests
}

// noVolumesLeft waits for the Volumes and Snapshots of earlier scenarios
// (their namespaces went, their claims and VolumeSnapshots with them) to
// be deleted: uninstall refuses while one is left.
func (s *scenario) noVolumesLeft() {
	s.t.Helper()
	var left string
	s.waitForSaying("no Volume or Snapshot left", 3*time.Minute, func(context.Context) (bool, error) {
		out, err := s.kubectl("get", "volumes.berth.io,snapshots.berth.io", "-o", "name")
		left = strings.Join(strings.Fields(out), " ")
		return err == nil && left == "", nil
	}, func() string { return "left: " + left })
}

// deleteStorageClusters deletes every StorageCluster and waits for each
// to be cleaned up and gone.
func (s *scenario) deleteStorageClusters() {
	s.t.Helper()
	out, err := s.kubectl("get", "storageclusters", "-o", "jsonpath={.items[*].metadata.name}")
	if err != nil {
		s.t.Fatal(err)
	}
	for _, name := range strings.Fields(out) {
		s.deleteStorageCluster(name)
	}
}

// berthGone waits until no pod of berth runs in namespace, and fails on
// anything of berth's left in it or cluster-wide (the CRDs aside).
func (s *scenario) berthGone(namespace string) {
	s.t.Helper()
	s.waitFor("berth's pods in "+namespace+" gone", 3*time.Minute, func(ctx context.Context) (bool, error) {
		pods, err := s.cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=berth"})
		return err == nil && len(pods.Items) == 0, err
	})
	// What berth's chart and operator make carries app.kubernetes.io/name=berth.
	var left []string
	for _, kind := range []string{
		"daemonsets", "deployments", "services", "poddisruptionbudgets", "jobs", "serviceaccounts", "roles", "rolebindings", "configmaps",
		"csidrivers", "storageclasses", "volumesnapshotclasses", "clusterroles", "clusterrolebindings",
		"validatingadmissionpolicies", "validatingadmissionpolicybindings",
	} {
		out, err := s.kubectl("get", kind, "-n", namespace, "-l", "app.kubernetes.io/name=berth", "-o", "name")
		if err != nil {
			if strings.Contains(out, "the server doesn't have a resource type") {
				continue // no snapshot API here
			}
			s.t.Errorf("list %s: %v", kind, err)
			continue
		}
		left = append(left, strings.Fields(out)...)
	}
	if len(left) > 0 {
		s.t.Errorf("berth's objects left after helm uninstall (namespace %s, and cluster-wide): %s", namespace, strings.Join(left, " "))
	}
	if _, err := s.cs.StorageV1().CSIDrivers().Get(s.ctx, "berth.io", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		s.t.Errorf("CSIDriver berth.io after helm uninstall: %v, want NotFound", err)
	}
	// The agents removed the Flexvolume driver as they stopped (the netns
	// nodes share this folder on the host).
	if dir := s.env.VolumePluginDir; dir != "" {
		driver := filepath.Join(dir, flexvolume.Dir)
		if _, err := os.Stat(driver); !os.IsNotExist(err) {
			s.t.Errorf("Flexvolume driver folder %s after helm uninstall: %v, want it gone", driver, err)
		}
	}
}

// podsRunFrom fails unless every container of every pod in namespace runs
// an image under prefix.
func (s *scenario) podsRunFrom(namespace, prefix string) {
	s.t.Helper()
	pods, err := s.cs.CoreV1().Pods(namespace).List(s.ctx, metav1.ListOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	n := 0
	for _, p := range pods.Items {
		for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
			n++
			if !strings.HasPrefix(c.Image, prefix) {
				s.t.Errorf("pod %s container %s runs %s, want an image from %s", p.Name, c.Name, c.Image, prefix)
			}
		}
	}
	s.t.Logf("%d containers of %d pods in %s run images from %s", n, len(pods.Items), namespace, prefix)
}

// tagUserImages tags berth's image and the CSI sidecars under the user's
// registry name on every node, as pulling them from there would leave
// them, and returns the new names.
func (s *scenario) tagUserImages() []string {
	s.t.Helper()
	var made []string
	for _, node := range s.env.Nodes() {
		list, err := s.nodeCtr(node, "images", "ls", "-q")
		if err != nil {
			s.t.Fatalf("images on %s: %v", node, err)
		}
		for _, img := range strings.Fields(list) {
			name := img[strings.LastIndex(img, "/")+1:]
			if img != s.env.BerthImage && !(strings.HasPrefix(img, dev.SidecarRegistry+"/csi-") && !strings.Contains(name, "@")) {
				continue
			}
			to := userRegistry + "/" + name
			if out, err := s.nodeCtr(node, "images", "tag", "--force", img, to); err != nil {
				s.t.Fatalf("tag %s as %s on %s: %v: %s", img, to, node, err, out)
			}
			if !slices.Contains(made, to) {
				made = append(made, to)
			}
		}
	}
	s.t.Logf("tagged on every node: %s", strings.Join(made, " "))
	return made
}

func (s *scenario) untagUserImages(images []string) {
	for _, node := range s.env.Nodes() {
		if out, err := s.nodeCtr(node, append([]string{"images", "rm"}, images...)...); err != nil {
			s.t.Logf("untag on %s: %v: %s", node, err, out)
		}
	}
}

// nodeCtr runs ctr in node's containerd (k8s.io namespace).
func (s *scenario) nodeCtr(node string, args ...string) (string, error) {
	for _, vm := range s.env.vmNodes() {
		if vm == node {
			return s.env.vmExec(s.ctx, node, "ctr -n k8s.io "+strings.Join(args, " "))
		}
	}
	sock, err := s.env.nodeVar("CONTAINERD_SOCK", node)
	if err != nil {
		return "", err
	}
	out, err := exec.CommandContext(s.ctx, "ctr", append([]string{"-a", sock, "-n", "k8s.io"}, args...)...).CombinedOutput()
	return string(out), err
}

// removeUserInstall takes away what is left of the user's install after a
// failure (nothing after a pass): the scenario's claims, snapshot and pods
// first (the uninstall refuses while berth holds data), then its
// StorageCluster and its release; where the hook cannot run, the
// operator's objects by hand, the operator stopped first.
func (s *scenario) removeUserInstall(u *upgrade) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	orig := s.ctx
	s.ctx = ctx
	defer func() { cancel(); s.ctx = orig }()
	out, _ := u.tryHelm("get", "values", dev.Release, "-n", berthNamespace, "-o", "yaml")
	if !strings.Contains(out, userRegistry) {
		return // gone, or berth dev's own
	}
	if s.t.Failed() {
		s.dump() // as it was
		s.logKubectl("-n", berthNamespace, "logs", "job/berth-uninstall", "--tail=50")
	}
	_, _ = s.kubectl("-n", s.ns, "delete", "pods,volumesnapshots,pvc", "--all", "--timeout=3m")
	_, _ = s.kubectl("-n", berthNamespace, "annotate", "sharemanagers", "--all", v1.KeepRunningAnnotation+"-")
	if left, ok := s.settles(3*time.Minute, func() (string, bool) {
		out, err := s.kubectl("get", "volumes.berth.io,snapshots.berth.io", "-o", "name")
		return out, err == nil && strings.TrimSpace(out) == ""
	}); !ok {
		s.t.Logf("volumes left after the scenario's claims went: %s", left)
	}
	_, _ = s.kubectl("delete", "storageclusters", "--all", "--timeout=3m")
	_, err := u.tryHelm("uninstall", dev.Release, "-n", berthNamespace, "--wait", "--timeout", "5m")
	if err == nil {
		return
	}
	s.t.Log(err)
	_, _ = s.kubectl("-n", berthNamespace, "scale", "deployment", "berth-operator", "--replicas=0")
	_, _ = s.kubectl("-n", berthNamespace, "wait", "--for=delete", "pod", "-l", "app.kubernetes.io/component=operator", "--timeout=2m")
	_, _ = s.kubectl("-n", berthNamespace, "delete", "daemonsets,deployments,services,poddisruptionbudgets",
		"-l", "app.kubernetes.io/managed-by=berth-operator")
	_, _ = s.kubectl("delete", "csidriver", "berth.io", "--ignore-not-found")
	_, _ = u.tryHelm("uninstall", dev.Release, "-n", berthNamespace, "--no-hooks", "--ignore-not-found")
}

// reinstallDev installs berth dev's release again with its values (the
// CRDs applied first, as berth dev up does), and its StorageClusters.
func (u *upgrade) reinstallDev(chart string, clusters []string) {
	s, t := u.s, u.s.t
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	orig := s.ctx
	s.ctx = ctx
	defer func() { cancel(); s.ctx = orig }()
	u.applyCRDs(chart)
	if left, ok := s.settles(3*time.Minute, func() (string, bool) {
		out, err := s.kubectl("get", "storageclusters", "-o", "name")
		return out, err == nil && strings.TrimSpace(out) == ""
	}); !ok {
		t.Errorf("StorageClusters still there before berth dev's install comes back: %s", left)
	}
	if _, err := u.tryHelm("upgrade", "--install", dev.Release, chart, "-n", berthNamespace, "-f", u.values); err != nil {
		t.Error(err)
		return
	}
	for _, m := range clusters {
		if out, err := s.kubectlIn(m, "apply", "-f", "-"); err != nil {
			t.Errorf("make the StorageCluster again: %v: %s", err, out)
		}
	}
	u.clustersReady()
}
