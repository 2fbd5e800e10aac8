//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/controller/sharemanager"
	"github.com/berth-io/berth/internal/controller/storagecluster"
	"github.com/berth-io/berth/internal/network"
)

// syncingWriter is appendingWriter that syncs each line, so every line
// goes through the volume's server (the page cache alone would hide a cut
// network until the next writeback).
const syncingWriter = `i=0; while true; do { echo $i >> /data/log && sync; } || { echo WRITE-ERROR $i; exit 1; }; i=$((i+1)); sleep 0.2; done`

// verifyLog is a pod script that checks /data/log holds 0, 1, 2, ... with
// no gap or repeat, and writeChecked's file, then sleeps.
const verifyLog = `awk 'NR-1 != $1 { print "BAD LINE " NR ": " $0; exit 1 } END { print "lines " NR }' /data/log && ` + verifyChecked

// agentRestarts is how often the scenarios below delete the agent pods.
const agentRestarts = 3

// testMultusMoverAgentRestarts is multusAgentRestarts in the mover mode,
// then a holder deleted: its copy is removed from the node, the new
// holder's copy made, and the node and the cluster get an Event saying
// what that meant for the node.
func testMultusMoverAgentRestarts(t *testing.T) { multusAgentRestarts(t, v1.MultusModeMover) }

// testMultusNetnsAgentRestarts is multusAgentRestarts in the netns mode.
func testMultusNetnsAgentRestarts(t *testing.T) { multusAgentRestarts(t, v1.MultusModeNetns) }

// multusAgentRestarts: a ceph StorageCluster on the multus public network
// in mode; a pod writes (and syncs) to a userspace volume of it, and a
// client keeps files in an RWX share of it; the agent pods of the writer's
// and the share manager's nodes are deleted and come back, three times:
// the writer sees no error and never restarts, each round's client
// verifies the files of the rounds before; at the end the volume, staged
// afresh on the other node, holds every line and the checksummed file
// (the failure the multus design exists to prevent: an agent restart that
// cuts the network under mounted volumes).
func multusAgentRestarts(t *testing.T, mode v1.MultusMode) {
	s := newScenario(t, 20*time.Minute)
	nad, _ := s.needMultus()
	s.needBerthImage()
	base := s.cephCluster()
	nodes := s.env.twoNodes(t)
	name := "multus-" + string(mode)
	class := s.multusCephCluster(name, base, nad, mode)
	// The bytes below can only travel on the storage networks.
	s.cephOnStorageNetworks(mode)

	// The writer on the first node, checksummed data first.
	s.pvc("vol", class, "128Mi", corev1.ReadWriteOnce, false)
	handle := s.boundPV("vol").Spec.CSI.VolumeHandle
	s.pod("writer", strings.TrimSuffix(writeChecked, "exec sleep 3600")+syncingWriter, claimSource("vol"), false)
	s.checked("writer", "written")
	s.serverInMode(name, mode, handle)

	// The share, held up, with a file kept by a client on the second node.
	s.pvc("shared", class, "64Mi", corev1.ReadWriteMany, false)
	vol := s.boundPV("shared").Spec.CSI.VolumeHandle
	s.keepShareRunning(vol)
	share := s.shareRunning(vol, "")
	endpoint := sharemanager.Endpoint(berthNamespace, vol)
	kept := map[string]string{}
	s.keepThrough(nodes[1], "probe-0", endpoint, kept)

	restartNodes := []string{s.node}
	if share.Spec.NodeName != s.node {
		restartNodes = append(restartNodes, share.Spec.NodeName)
	}
	for round := 1; round <= agentRestarts; round++ {
		for _, node := range restartNodes {
			s.restartAgent(node)
		}
		after := fmt.Sprintf("after agent restart %d (%s)", round, mode)
		s.writerUnharmed("writer", after, time.Minute)
		if p := s.shareRunning(vol, ""); p.UID != share.UID {
			t.Errorf("the share manager was replaced %s: %s, was %s", after, p.UID, share.UID)
		}
		s.keepThrough(nodes[1], fmt.Sprintf("probe-%d", round), endpoint, kept)
	}
	s.serverInMode(name, mode, handle)
	t.Logf("%s: the writer wrote %d lines through %d agent restarts on %v", mode, s.logLines("writer"), agentRestarts, restartNodes)

	// The data, from Ceph: the writer gone (its node unstages), the volume
	// staged on the other node.
	s.deletePod("writer")
	s.node = nodes[1]
	s.pod("verify", verifyLog, claimSource("vol"), false)
	s.checked("verify", "/data/f: OK")
	out, _ := s.kubectl("-n", s.ns, "logs", "verify")
	t.Logf("verify on %s: %s", s.node, strings.TrimSpace(out))
	s.node = nodes[0]

	if mode == v1.MultusModeMover {
		s.holderDeleted(name)
	}
}

// multusCephCluster makes the StorageCluster name on the test Ceph of the
// ceph StorageCluster base, with provider multus on the public network
// nad in mode, waits until it is Ready, its holders (and the mover) run
// on every node and the agent rolled out with its data dir, and returns
// its userspace class. At the end the namespace's pods and claims go, then
// the cluster and its folder.
func (s *scenario) multusCephCluster(name, base, nad string, mode v1.MultusMode) string {
	s.t.Helper()
	t := s.t
	ceph, err := s.kubectl("get", "storagecluster", base, "-o",
		`jsonpath={.spec.ceph.monitors[0]}|{.spec.ceph.pool}|{.spec.ceph.secretRef.name}|{.spec.ceph.secretRef.namespace}`)
	parts := strings.Split(ceph, "|")
	if err != nil || len(parts) != 4 {
		t.Fatalf("the ceph spec of %s: %q %v", base, ceph, err)
	}
	dir := s.storageCluster(name, fmt.Sprintf(`  backend: ceph
  ceph:
    monitors: [%q]
    pool: %s
    secretRef: {name: %s, namespace: %s}
  network:
    provider: multus
    selectors: {public: %s}
    multus: {mode: %s}
`, parts[0], parts[1], parts[2], parts[3], nad, mode))
	class := name + "-userspace"
	// Cleanups run last first: the volumes go before the cluster.
	t.Cleanup(func() { s.removeVolumesOf(class) })
	s.waitClustersReady(4*time.Minute, name)
	nodes := s.env.Nodes()
	s.waitFor(fmt.Sprintf("%d holders of %s Ready", len(nodes), name), 3*time.Minute, func(ctx context.Context) (bool, error) {
		holders, err := s.holders(ctx, name)
		return err == nil && len(holders) == len(nodes) && !slices.ContainsFunc(holders, func(p corev1.Pod) bool { return !podReady(&p) }), err
	})
	if mode == v1.MultusModeMover {
		for _, node := range nodes {
			s.waitCopy(name, node, func(copies []string) bool { return len(copies) == 1 })
		}
	}
	s.waitAgentWith(dir)
	return class
}

// holders lists the holder pods of cluster that are not being deleted.
func (s *scenario) holders(ctx context.Context, cluster string) ([]corev1.Pod, error) {
	list, err := s.cs.CoreV1().Pods(berthNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=berth,app.kubernetes.io/instance=" + cluster + ",app.kubernetes.io/component=holder",
	})
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(list.Items, func(p corev1.Pod) bool { return !p.DeletionTimestamp.IsZero() }), nil
}

// holderOn is cluster's running holder pod on node.
func (s *scenario) holderOn(cluster, node string) *corev1.Pod {
	s.t.Helper()
	var holder *corev1.Pod
	s.waitFor("a holder of "+cluster+" Ready on "+node, 3*time.Minute, func(ctx context.Context) (bool, error) {
		holders, err := s.holders(ctx, cluster)
		for i := range holders {
			if holders[i].Spec.NodeName == node && podReady(&holders[i]) {
				holder = &holders[i]
				return true, nil
			}
		}
		return false, err
	})
	return holder
}

// copies lists the mover's copies (network.CopyName of a holder pod UID)
// in node's network namespace, by name.
func (s *scenario) copies(node string) ([]string, error) {
	netns, err := s.env.nodeVar("NODE_NETNS", node)
	if err != nil {
		return nil, err
	}
	out, err := exec.CommandContext(s.ctx, "ip", "-n", netns, "-o", "link", "show").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("ip -n %s link show: %w: %s", netns, err, out)
	}
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^\d+: ([^:@]+)[:@]`).FindAllStringSubmatch(string(out), -1) {
		if network.IsCopyName(m[1]) {
			names = append(names, m[1])
		}
	}
	return names, nil
}

// waitCopy waits until the copies in node's namespace satisfy ok and
// returns them.
func (s *scenario) waitCopy(cluster, node string, ok func(copies []string) bool) []string {
	s.t.Helper()
	var copies []string
	s.waitFor("the mover's copies on "+node, 2*time.Minute, func(context.Context) (bool, error) {
		var err error
		copies, err = s.copies(node)
		return err == nil && ok(copies), err
	})
	s.t.Logf("copies on %s (%s): %v", node, cluster, copies)
	return copies
}

// holderDeleted deletes cluster's holder on the scenario's node: the
// mover removes its copy, makes one of the new holder's, and the node and
// the cluster get an Event saying what the deletion meant for the node.
func (s *scenario) holderDeleted(cluster string) {
	s.t.Helper()
	old := s.holderOn(cluster, s.node)
	copyName := network.CopyName(string(old.UID))
	s.waitCopy(cluster, s.node, func(c []string) bool { return slices.Equal(c, []string{copyName}) })
	if err := s.cs.CoreV1().Pods(berthNamespace).Delete(s.ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		s.t.Fatalf("delete holder %s: %v", old.Name, err)
	}
	s.waitCopy(cluster, s.node, func(c []string) bool { return !slices.Contains(c, copyName) })
	renewed := s.holderOn(cluster, s.node)
	if renewed.UID == old.UID {
		s.t.Fatalf("holder %s still there", old.Name)
	}
	s.waitCopy(cluster, s.node, func(c []string) bool { return slices.Equal(c, []string{network.CopyName(string(renewed.UID))}) })
	s.waitEvents("", "Node", s.node, time.Minute, storagecluster.ReasonHolderDeleted, old.Name, "storage network")
	s.waitEvents("", "StorageCluster", cluster, time.Minute, storagecluster.ReasonHolderDeleted, old.Name)
}

// restartAgent deletes the agent pod on node and waits for a new one Ready.
func (s *scenario) restartAgent(node string) {
	s.t.Helper()
	onNode := metav1.ListOptions{LabelSelector: agentPods, FieldSelector: "spec.nodeName=" + node}
	agents, err := s.cs.CoreV1().Pods(berthNamespace).List(s.ctx, onNode)
	if err != nil || len(agents.Items) != 1 {
		s.t.Fatalf("agent pods on %s: %v (%d)", node, err, len(agents.Items))
	}
	old := agents.Items[0].UID
	if err := s.cs.CoreV1().Pods(berthNamespace).Delete(s.ctx, agents.Items[0].Name, metav1.DeleteOptions{}); err != nil {
		s.t.Fatalf("delete agent pod: %v", err)
	}
	s.waitFor("a new agent pod Ready on "+node, 2*time.Minute, func(ctx context.Context) (bool, error) {
		list, err := s.cs.CoreV1().Pods(berthNamespace).List(ctx, onNode)
		if err != nil {
			return false, err
		}
		return slices.ContainsFunc(list.Items, func(p corev1.Pod) bool { return p.UID != old && podReady(&p) }), nil
	})
}

// keepThrough runs a probe on node that verifies every file in kept and
// keeps one of its own (named after the probe), added to kept.
func (s *scenario) keepThrough(node, probe, endpoint string, kept map[string]string) {
	s.t.Helper()
	args := []string{"--keep", probe}
	for name, sum := range kept {
		args = append(args, "--verify", name+"="+sum)
	}
	out := s.probeOn(node, probe, endpoint, args...)
	for name, sum := range kept {
		if !strings.Contains(out, "verified "+name+" sha256 "+sum) {
			s.t.Errorf("probe %s did not verify %s:\n%s", probe, name, out)
		}
	}
	m := regexp.MustCompile(`(?m)^kept ` + regexp.QuoteMeta(probe) + ` sha256 ([0-9a-f]{64})$`).FindStringSubmatch(out)
	if m == nil {
		s.t.Fatalf("probe %s printed no kept checksum:\n%s", probe, out)
	}
	kept[probe] = m[1]
}

// waitAgentWith waits until the agent DaemonSet rolled out with an
// argument naming dir (a new StorageCluster's data dir).
func (s *scenario) waitAgentWith(dir string) {
	s.t.Helper()
	s.waitFor("the agent rolled out with "+dir, 4*time.Minute, func(ctx context.Context) (bool, error) {
		ds, err := s.cs.AppsV1().DaemonSets(berthNamespace).Get(ctx, "berth-agent", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		st := ds.Status
		return strings.Contains(strings.Join(ds.Spec.Template.Spec.Containers[0].Args, " "), dir) &&
			st.ObservedGeneration == ds.Generation && st.UpdatedNumberScheduled == st.DesiredNumberScheduled &&
			st.NumberAvailable == st.DesiredNumberScheduled, nil
	})
}

// serverInMode checks that the blockdev server of volume on the scenario's
// node runs in the network namespace mode gives it: the node's own with the
// mover (its copy is there), the namespace of cluster's holder on the node
// in the netns mode (as its record names it).
func (s *scenario) serverInMode(cluster string, mode v1.MultusMode, volume string) {
	s.t.Helper()
	var want string
	if mode == v1.MultusModeMover {
		netns, err := s.env.nodeVar("NODE_NETNS", s.node)
		if err != nil {
			s.t.Fatal(err)
		}
		want = nsInode("/run/netns/" + netns)
	} else {
		holder := s.holderOn(cluster, s.node)
		path, err := s.env.NodePath(s.node, "berth-network", "netns", cluster, string(holder.UID)+".json")
		if err != nil {
			s.t.Fatal(err)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			s.t.Fatal(err)
		}
		var rec network.Record
		if err := json.Unmarshal(data, &rec); err != nil {
			s.t.Fatalf("holder record %s: %v", path, err)
		}
		want = strconv.FormatUint(rec.NetNS.Ino, 10)
	}
	pids := serverPIDs(volume)
	if len(pids) == 0 {
		s.t.Fatalf("no blockdev server of %s on this machine", volume)
	}
	for _, pid := range pids {
		if got := nsInode(fmt.Sprintf("/proc/%d/ns/net", pid)); got != want {
			s.t.Errorf("blockdev server %d of %s in netns %s, want %s (%s mode)", pid, volume, got, want, mode)
		}
	}
	s.t.Logf("%s mode: the blockdev server(s) %v of %s run in netns %s", mode, pids, volume, want)
}

// serverPIDs are the processes of this machine that serve volume (berth
// blockdev ... --volume volume).
func serverPIDs(volume string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmd), "\x00")
		if slices.Contains(args, "blockdev") && slices.Contains(args, volume) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// nsInode is the inode of the namespace file path ("" when unreadable).
func nsInode(path string) string {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return ""
	}
	return strconv.FormatUint(st.Ino, 10)
}
