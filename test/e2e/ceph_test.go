//go:build e2e

package e2e

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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

// The Ceph scenarios run on a ceph StorageCluster of the e2e cluster:
// hack/e2e.sh asks `berth dev up --test-ceph` for one (berth-ceph, on the
// test Ceph of hack/cluster/ceph.sh in its own netns on the node bridge),
// `berth dev up --backend ceph` makes berth itself one. Their claims use
// its userspace class (krbd, the kernel mounter, is missing here).

// writeChecked is a pod script that writes 8 MiB of random data and its
// checksum to /data and syncs, then sleeps.
const writeChecked = "dd if=/dev/urandom of=/data/f bs=1M count=8 2>/dev/null && " +
	"sha256sum /data/f > /data/f.sum && sync && echo written && exec sleep 3600"

// verifyChecked is a pod script that checks the data of writeChecked, then
// sleeps.
const verifyChecked = "sha256sum -c /data/f.sum && exec sleep 3600"

// cephCluster is the name of the cluster's ceph StorageCluster, once Ready;
// it skips the scenario when there is none.
func (s *scenario) cephCluster() string {
	s.t.Helper()
	out, err := s.kubectl("get", "storageclusters", "-o",
		`jsonpath={range .items[?(@.spec.backend=="ceph")]}{.metadata.name}{"\n"}{end}`)
	if err != nil {
		s.t.Fatal(err)
	}
	names := strings.Fields(out)
	if len(names) == 0 {
		s.t.Skip("no ceph StorageCluster in the e2e cluster: hack/e2e.sh adds one (berth dev up --test-ceph) " +
			"unless BERTH_E2E_CEPH=0, the ceph packages are missing or bin/berth was built without Ceph (CEPH=0); its log says which")
	}
	name := names[0]
	s.waitClustersReady(2*time.Minute, name)
	return name
}

// cephCLI runs the ceph CLI as client.admin in the test Ceph's netns
// (hack/cluster/ceph.sh ceph ARGS).
func (s *scenario) cephCLI(args ...string) (string, error) {
	script := filepath.Join(repoRoot(), "hack", "cluster", "ceph.sh")
	ctx, cancel := context.WithTimeout(s.ctx, 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, script, append([]string{"ceph"}, args...)...)
	cmd.Env = append(os.Environ(), "BERTH_E2E_DIR="+s.env.Vars["BERTH_E2E_DIR"])
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ceph.sh ceph %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// blocklisted tells which of addrs Ceph's blocklist holds.
func (s *scenario) blocklisted(addrs []string) []string {
	s.t.Helper()
	out, err := s.cephCLI("osd", "blocklist", "ls")
	if err != nil {
		s.t.Fatal(err)
	}
	var in []string
	for _, a := range addrs {
		if strings.Contains(out, bareAddr(a)) {
			in = append(in, a)
		}
	}
	return in
}

// bareAddr drops a messenger prefix ("v2:") from a client address.
func bareAddr(a string) string {
	if _, rest, ok := strings.Cut(a, ":"); ok && (strings.HasPrefix(a, "v1:") || strings.HasPrefix(a, "v2:")) {
		return rest
	}
	return a
}

// cephXFSClass makes (or finds) an xfs class on the ceph cluster's
// userspace class (xfs grows online without CAP_SYS_RESOURCE, which ext4's
// resize needs and this machine lacks). At the end the namespace's claims
// go, then the class, once its volumes are gone.
func (s *scenario) cephXFSClass(cluster string) string {
	s.t.Helper()
	base, err := s.cs.StorageV1().StorageClasses().Get(s.ctx, cluster+"-userspace", metav1.GetOptions{})
	if err != nil {
		s.t.Fatalf("the ceph cluster's userspace class: %v", err)
	}
	name := cluster + "-xfs"
	params := map[string]string{}
	for k, v := range base.Parameters {
		params[k] = v
	}
	params["csi.storage.k8s.io/fstype"] = "xfs"
	cls := &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: base.Provisioner, Parameters: params,
		ReclaimPolicy: ptr.To(corev1.PersistentVolumeReclaimDelete), VolumeBindingMode: base.VolumeBindingMode,
		AllowVolumeExpansion: ptr.To(true),
	}
	if _, err := s.cs.StorageV1().StorageClasses().Create(s.ctx, cls, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		s.t.Fatalf("create StorageClass %s: %v", name, err)
	}
	s.t.Cleanup(func() {
		s.removeVolumesOf(name)
		if err := s.cs.StorageV1().StorageClasses().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			s.t.Errorf("delete StorageClass %s: %v", name, err)
		}
	})
	return name
}

// checked waits for the pod's script to print what says it succeeded.
func (s *scenario) checked(pod, want string) {
	s.t.Helper()
	s.running(pod)
	s.waitFor("pod "+pod+": "+want, 2*time.Minute, func(context.Context) (bool, error) {
		out, err := s.kubectl("-n", s.ns, "logs", pod)
		return err == nil && strings.Contains(out, want), nil
	})
}

// testCephSnapshotCloneExpand: a Ceph volume (userspace, xfs) in a pod:
// checksummed data; a VolumeSnapshot of it restores to a claim with the
// data of the snapshot's moment; a clone of the claim (dataSource a PVC)
// has the data of the clone's moment; the claim grows online, seen in the
// pod, with the data intact.
func testCephSnapshotCloneExpand(t *testing.T) {
	s := newScenario(t, 8*time.Minute)
	cluster := s.cephCluster()
	s.needSnapshotAPI()
	class := s.cephXFSClass(cluster)

	s.pvc("src", class, "320Mi", corev1.ReadWriteOnce, false)
	s.boundPV("src")
	s.pod("writer", writeChecked, claimSource("src"), false)
	s.checked("writer", "written")

	s.createSnapshot("snap", cluster, "src")
	s.waitFor("VolumeSnapshot readyToUse", 3*time.Minute, func(context.Context) (bool, error) {
		out, err := s.kubectl("-n", s.ns, "get", "volumesnapshot", "snap", "-o", "jsonpath={.status.readyToUse}")
		return err == nil && out == "true", nil
	})
	// Changed after the snapshot: the restore must have the old data, the
	// clone (taken later) the new.
	if _, err := s.exec("writer", "echo after > /data/f && sha256sum /data/f > /data/f.sum && sync"); err != nil {
		t.Fatalf("write after the snapshot: %v", err)
	}
	s.restoredPVC("restored", class, "snap", "320Mi")
	s.boundPV("restored")
	s.pod("restored", verifyChecked, claimSource("restored"), false)
	s.checked("restored", "/data/f: OK")
	if got, err := s.exec("restored", "head -c 5 /data/f"); err != nil || got == "after" {
		t.Errorf("the restore holds the data written after the snapshot (%q, %v)", got, err)
	}

	clone := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "clone", Annotations: map[string]string{selectedNodeAnnotation: s.node}},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &class, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			DataSource: &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "src"},
			Resources:  corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("320Mi")}},
		},
	}
	if _, err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Create(s.ctx, clone, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the clone: %v", err)
	}
	s.boundPV("clone")
	s.pod("clone", verifyChecked, claimSource("clone"), false)
	s.checked("clone", "/data/f: OK")
	if got, err := s.exec("clone", "cat /data/f"); err != nil || strings.TrimSpace(got) != "after" {
		t.Errorf("the clone holds %q (%v), want the data of the clone's moment", got, err)
	}

	before := s.dfKiB("writer")
	patch := []byte(`{"spec":{"resources":{"requests":{"storage":"640Mi"}}}}`)
	if _, err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Patch(s.ctx, "src", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("expand PVC: %v", err)
	}
	var after int64
	s.waitFor("the writer to see the larger filesystem", 3*time.Minute, func(context.Context) (bool, error) {
		size, err := s.tryDfKiB("writer")
		if err != nil {
			s.t.Logf("%v; trying again", err)
			return false, nil
		}
		after = size
		return after > before+200*1024, nil
	})
	t.Logf("filesystem in the pod: %d KiB -> %d KiB", before, after)
	if out, err := s.exec("writer", "sha256sum -c /data/f.sum"); err != nil {
		t.Errorf("data after the expansion: %v: %s", err, out)
	}
}

// testCephVolumeMovesOffLostNode: a pod writes checksummed data to a Ceph
// volume on node A; node A is lost (stopped: kubelet, containerd, every
// pod's process, berth's servers and keeper) and tainted out-of-service;
// the pod re-created on node B runs with the data. Node B's stage broke
// A's lock: A's Ceph clients (the Attachment's record) are on Ceph's
// blocklist and in A's NodeCleanup, and a write through A's leftover mount
// fails. Node A back and the taint lifted: A's agent cleans its stale
// stage and the pod on B keeps its data, and A's clients leave the
// blocklist after the operator's cool-down (berth dev up
// --unfence-cooldown). The nodes share one kernel: A's cleaner must not
// take B's loop device, whose file has the same path, for the volume's.
func testCephVolumeMovesOffLostNode(t *testing.T) {
	s := newScenario(t, 10*time.Minute)
	nodes := s.env.twoNodes(t)
	cluster := s.cephCluster()
	class := cluster + "-userspace"
	// Node A runs no operator: the Unfencer must run while A is lost.
	nodeA, nodeB := nodes[len(nodes)-1], nodes[0]
	ops, err := s.cs.CoreV1().Pods(berthNamespace).List(s.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=operator"})
	if err == nil && len(ops.Items) > 0 && ops.Items[0].Spec.NodeName == nodeA {
		nodeA, nodeB = nodeB, nodeA
	}
	s.node = nodeA
	s.pvc("data", class, "64Mi", corev1.ReadWriteOnce, false)
	pv := s.boundPV("data")
	volume := pv.Spec.CSI.VolumeHandle
	writer := s.pod("writer", writeChecked, claimSource("data"), false)
	s.checked("writer", "written")

	var clients []string
	s.waitFor("node A's Ceph clients in the Attachment's status", time.Minute, func(context.Context) (bool, error) {
		out, err := s.kubectl("get", "attachments.berth.io", volume, "-o",
			`jsonpath={.status.nodes[?(@.node=="`+nodeA+`")].cephClients[*]}`)
		clients = strings.Fields(out)
		return err == nil && len(clients) > 0, nil
	})
	t.Logf("node A (%s) serves %s as Ceph clients %v", nodeA, volume, clients)
	staged := s.volumeMounts(nodeA, pv, writer.UID)
	if len(staged) == 0 {
		t.Fatalf("no mount of %s on node A", volume)
	}

	s.stopNode(nodeA)
	// Known to be down (stopped): tainted at once, as an admin who knows does.
	s.taintOutOfService(nodeA)
	zero := int64(0)
	if err := s.cs.CoreV1().Pods(s.ns).Delete(s.ctx, "writer", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	s.node = nodeB
	s.pod("mover", verifyChecked, claimSource("data"), false)
	s.checked("mover", "/data/f: OK")
	t.Logf("the pod runs on node B (%s) with the data written on node A", nodeB)

	if in := s.blocklisted(clients); len(in) != len(clients) {
		t.Errorf("node A's clients %v: only %v on Ceph's blocklist after B took the volume", clients, in)
	}
	out, err := s.kubectl("get", "nodecleanups.berth.io", nodeA, "-o", "jsonpath={.spec.blocklisted[*].address}")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range clients {
		if !strings.Contains(out, bareAddr(c)) {
			t.Errorf("node A's NodeCleanup records blocklisted %q, without %s", out, c)
		}
	}
	// Node A's processes died with it: what is left there is its mount.
	// A write through it must fail, never end as a silent success.
	s.writeFails(nodeA, staged)

	if err := s.env.NodeAction(s.ctx, nodeA, "start"); err != nil {
		t.Fatal(err)
	}
	waitNodeReady(s.ctx, t, s.cs, nodeA, true)
	if out, err := s.kubectl("taint", "node", nodeA, corev1.TaintNodeOutOfService+"-"); err != nil {
		t.Fatalf("untaint: %v: %s", err, out)
	}
	s.waitFor("node A cleaned: no mount of the volume left there", 3*time.Minute, func(context.Context) (bool, error) {
		return len(s.volumeMounts(nodeA, pv, writer.UID)) == 0, nil
	})
	if out, err := s.exec("mover", "sha256sum -c /data/f.sum && echo more > /data/g && sync && cat /data/g"); err != nil ||
		!strings.Contains(out, "more") {
		t.Errorf("the pod on node B after A's return: %v: %s", err, out)
	}
	s.waitFor("node A's clients off the blocklist after the cool-down", 3*time.Minute, func(context.Context) (bool, error) {
		out, err := s.kubectl("get", "nodecleanups.berth.io", nodeA, "-o", "jsonpath={.spec.blocklisted[*].address}")
		return err == nil && strings.TrimSpace(out) == "" && len(s.blocklisted(clients)) == 0, nil
	})
	t.Logf("node A's events: %q", s.clusterEvents("NodeCleanup", nodeA))
}

// volumeMounts are node's mounts of pv: its staging mount (kubelet names
// the folder after the volume handle's SHA-256) and the mount of pod uid.
func (s *scenario) volumeMounts(node string, pv *corev1.PersistentVolume, uid types.UID) []string {
	s.t.Helper()
	sum := fmt.Sprintf("%x", sha256.Sum256([]byte(pv.Spec.CSI.VolumeHandle)))
	m, err := s.env.NodeMounts(s.ctx, node, "/"+sum+"/", string(uid)+"/volumes/kubernetes.io~csi/"+pv.Name+"/")
	if err != nil {
		s.t.Fatal(err)
	}
	return m
}

// writeFails writes and syncs 1 MiB through each of node's mounts (from
// the host, in the node's mount namespace) and fails the test on a write
// that succeeds.
func (s *scenario) writeFails(node string, mounts []string) {
	s.t.Helper()
	mntns, err := s.env.nodeVar("NODE_MNTNS", node)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, m := range mounts {
		ctx, cancel := context.WithTimeout(s.ctx, 60*time.Second)
		out, err := exec.CommandContext(ctx, "nsenter", "--mount="+mntns, "--", "dd", "if=/dev/zero",
			"of="+filepath.Join(m, "after-loss"), "bs=1M", "count=1", "conv=fsync").CombinedOutput()
		cancel()
		if err == nil {
			s.t.Errorf("a write through node %s's mount %s succeeded after the volume moved: %s", node, m, out)
			continue
		}
		s.t.Logf("write through %s on the lost node: %v: %s", m, err, strings.TrimSpace(string(out)))
	}
}

// removeVolumesOf deletes the namespace's pods, snapshots and claims and
// waits until no PV of class is left: the pods first, gone for good, so
// that their nodes unstage and close the images (an open image cannot be
// removed), then the snapshots (an image with snapshots cannot be removed).
func (s *scenario) removeVolumesOf(class string) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	_ = s.cs.CoreV1().Pods(s.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	_ = wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		pods, err := s.cs.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0, nil
	})
	_, _ = s.kubectl("-n", s.ns, "delete", "volumesnapshots", "--all", "--wait=false")
	_ = s.cs.CoreV1().PersistentVolumeClaims(s.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		pvs, err := s.cs.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return !slices.ContainsFunc(pvs.Items, func(pv corev1.PersistentVolume) bool { return pv.Spec.StorageClassName == class }), nil
	})
	if err != nil {
		s.t.Errorf("volumes of %s still there: %v", class, err)
	}
}
