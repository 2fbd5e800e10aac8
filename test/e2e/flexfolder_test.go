//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-io/berth/internal/cli/dev"
)

// flexvolumeCondition is the Node condition the agent keeps about its
// Flexvolume driver (internal/cli/agent.FlexvolumeCondition).
const flexvolumeCondition corev1.NodeConditionType = "BerthFlexvolumeReady"

// Scenario: kubelet's plugin folder cannot be made on the nodes (a
// read-only /usr, as on Flatcar or Talos). The agent pods still start and
// serve CSI (a claim's pod runs); each node says why Flexvolume is out in
// its BerthFlexvolumeReady condition and a FlexvolumeDriverFailed Event.
// Before, the agent mounted the folder as a hostPath that kubelet could
// not make, and no agent pod started. Then the release's values come
// back and the driver is installed again.
func testFlexvolumeReadOnlyPluginFolder(t *testing.T) {
	s := newScenario(t, 10*time.Minute)
	nodes := s.env.Nodes()
	mntns := map[string]string{}
	for _, n := range nodes {
		f, err := s.env.nodeVar("NODE_MNTNS", n)
		if err != nil {
			t.Skipf("node %s has no mount namespace on this machine (a VM node): %v", n, err)
		}
		mntns[n] = f
	}
	// A read-only file system on every node, where the plugin folder
	// would have to be made.
	ro := filepath.Join(filepath.Dir(s.env.VolumePluginDir), "read-only-usr")
	pluginDir := filepath.Join(ro, "libexec", "kubernetes", "exec")
	for n, f := range mntns {
		nsenter := func(args ...string) error {
			out, err := exec.CommandContext(s.ctx, "nsenter", append([]string{"--mount=" + f, "--"}, args...)...).CombinedOutput()
			if err != nil {
				return fmt.Errorf("node %s: %s: %w: %s", n, strings.Join(args, " "), err, out)
			}
			return nil
		}
		// The nodes' folders below the cluster's work dir may share
		// mounts: one made on one node can show on the others.
		if err := nsenter("sh", "-c", "mkdir -p "+ro+" && { mountpoint -q "+ro+" || mount -t tmpfs -o ro,size=1m berth-read-only "+ro+"; }"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := nsenter("sh", "-c", "{ ! mountpoint -q "+ro+" || umount "+ro+"; } && { [ ! -d "+ro+" ] || rmdir "+ro+"; }"); err != nil {
				t.Error(err)
			}
		})
	}

	u := s.newUpgrade()
	chart := filepath.Join(repoRoot(), "deploy", "berth")
	before := s.agentPodUIDs()
	u.helm("upgrade", dev.Release, chart, "-n", berthNamespace, "-f", u.values, "--set", "volumePluginDir="+pluginDir)
	rolledBack := false
	defer func() {
		if !rolledBack {
			_, _ = u.tryHelm("rollback", dev.Release, "-n", berthNamespace)
		}
	}()
	s.agentsReplaced(before, 4*time.Minute)
	for _, n := range nodes {
		s.waitFor("node "+n+" condition "+string(flexvolumeCondition)+" False naming the read-only folder", 2*time.Minute, func(ctx context.Context) (bool, error) {
			c, err := s.nodeCondition(ctx, n, flexvolumeCondition)
			if err != nil || c == nil {
				return false, err
			}
			return c.Status == corev1.ConditionFalse && c.Reason == "InstallFailed" && strings.Contains(c.Message, "read-only file system"), nil
		})
		if ev := s.clusterEvents("Node", n); !anyContains(ev, "FlexvolumeDriverFailed") {
			t.Errorf("node %s: no FlexvolumeDriverFailed Event: %v", n, ev)
		}
	}

	// CSI is served all the same.
	s.pvc("csi", "berth", "32Mi", corev1.ReadWriteOnce, false)
	token := fmt.Sprintf("berth-ro-%d", time.Now().UnixNano())
	pod := s.pod("csi", "echo "+token+" > /data/f && sync && exec sleep 3600", claimSource("csi"), false)
	s.running(pod.Name)
	if got, err := s.exec(pod.Name, "cat /data/f"); err != nil || strings.TrimSpace(got) != token {
		t.Fatalf("read back %q (%v), want %q", got, err, token)
	}
	s.deletePod(pod.Name)

	before = s.agentPodUIDs()
	u.helm("rollback", dev.Release, "-n", berthNamespace)
	rolledBack = true
	s.agentsReplaced(before, 4*time.Minute)
	for _, n := range nodes {
		s.waitFor("node "+n+" condition "+string(flexvolumeCondition)+" True again", 2*time.Minute, func(ctx context.Context) (bool, error) {
			c, err := s.nodeCondition(ctx, n, flexvolumeCondition)
			return err == nil && c != nil && c.Status == corev1.ConditionTrue, err
		})
	}
}

// agentPodUIDs are the UIDs of the agent pods now.
func (s *scenario) agentPodUIDs() map[string]bool {
	s.t.Helper()
	list, err := s.cs.CoreV1().Pods(berthNamespace).List(s.ctx, metav1.ListOptions{LabelSelector: agentPods})
	if err != nil {
		s.t.Fatalf("agent pods: %v", err)
	}
	uids := map[string]bool{}
	for _, p := range list.Items {
		uids[string(p.UID)] = true
	}
	return uids
}

// agentsReplaced waits until every node runs a Ready agent pod that is
// none of old.
func (s *scenario) agentsReplaced(old map[string]bool, timeout time.Duration) {
	s.t.Helper()
	nodes := s.env.Nodes()
	s.waitForSaying("a new Ready agent pod on each node", timeout, func(ctx context.Context) (bool, error) {
		list, err := s.cs.CoreV1().Pods(berthNamespace).List(ctx, metav1.ListOptions{LabelSelector: agentPods})
		if err != nil {
			return false, err
		}
		fresh := map[string]bool{}
		for _, p := range list.Items {
			if old[string(p.UID)] {
				return false, nil
			}
			if podReady(&p) {
				fresh[p.Spec.NodeName] = true
			}
		}
		return len(fresh) == len(nodes), nil
	}, func() string {
		out, _ := s.kubectl("-n", berthNamespace, "get", "pods", "-l", agentPods, "-o", "wide")
		return out
	})
}

// nodeCondition is node's condition of type typ, or nil.
func (s *scenario) nodeCondition(ctx context.Context, node string, typ corev1.NodeConditionType) (*corev1.NodeCondition, error) {
	n, err := s.cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == typ {
			return &n.Status.Conditions[i], nil
		}
	}
	return nil, nil
}

func anyContains(lines []string, sub string) bool {
	for _, l := range lines {
		if strings.Contains(l, sub) {
			return true
		}
	}
	return false
}
