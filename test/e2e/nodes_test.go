//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Nodes are the cluster's node names (NODES), the first one first.
func (e Env) Nodes() []string {
	if n := strings.Fields(e.Vars["NODES"]); len(n) > 0 {
		return n
	}
	return []string{e.NodeName}
}

// need returns the cluster.env value of key and fails the test where it is
// missing; what says what the value is.
func (e Env) need(t *testing.T, key, what string) string {
	t.Helper()
	v := e.Vars[key]
	if v == "" {
		t.Fatalf("cluster.env lacks %s (%s)", key, what)
	}
	return v
}

// twoNodes returns the cluster's nodes and skips the test on a cluster of
// one node.
func (e Env) twoNodes(t *testing.T) []string {
	t.Helper()
	nodes := e.Nodes()
	if len(nodes) < 2 {
		t.Skip("one node: this scenario needs a second node (BERTH_E2E_NODES=2)")
	}
	return nodes
}

// stopNode stops node (its kubelet, containerd and pods' processes), and
// starts it and lifts the out-of-service taint when the test ends.
func (s *scenario) stopNode(node string) {
	s.t.Helper()
	s.t.Cleanup(func() {
		_ = s.env.NodeAction(context.Background(), node, "start")
		_, _ = s.kubectl("taint", "node", node, corev1.TaintNodeOutOfService+"-")
	})
	if err := s.env.NodeAction(s.ctx, node, "stop"); err != nil {
		s.t.Fatal(err)
	}
}

// taintOutOfService taints node out-of-service, as an admin does for a node
// known to be down: its pods and attachments may go elsewhere.
func (s *scenario) taintOutOfService(node string) {
	s.t.Helper()
	if out, err := s.kubectl("taint", "node", node, corev1.TaintNodeOutOfService+"=nodeshutdown:NoExecute"); err != nil {
		s.t.Fatalf("taint: %v: %s", err, out)
	}
}

// nodeVar is the per-node cluster.env value KEY_<i> of node.
func (e Env) nodeVar(key, node string) (string, error) {
	for i, n := range e.Nodes() {
		if n == node {
			if v := e.Vars[key+"_"+strconv.Itoa(i+1)]; v != "" {
				return v, nil
			}
			return "", fmt.Errorf("cluster.env lacks %s_%d (node %s)", key, i+1, node)
		}
	}
	return "", fmt.Errorf("no node %s in cluster.env (nodes %v)", node, e.Nodes())
}

// NodePath is where path of node's own folders (its /var/lib/kubelet,
// BERTH_DATA_DIR, /run/berth, ...) lives as seen from the host; the node's
// mount namespace binds $NODE_DIR_<i>/<name> over the standard path.
func (e Env) NodePath(node, name string, rel ...string) (string, error) {
	dir, err := e.nodeVar("NODE_DIR", node)
	if err != nil {
		return "", err
	}
	return filepath.Join(append([]string{dir, name}, rel...)...), nil
}

// NodeMounts lists the mount points of node's mount namespace that contain
// any of subs: kubelet and berth's agent mount there, not on the host.
func (e Env) NodeMounts(ctx context.Context, node string, subs ...string) ([]string, error) {
	mntns, err := e.nodeVar("NODE_MNTNS", node)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nsenter", "--mount="+mntns, "--", "cat", "/proc/self/mountinfo").Output()
	if err != nil {
		return nil, fmt.Errorf("mountinfo of node %s: %w", node, err)
	}
	var found []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		for _, sub := range subs {
			if strings.Contains(fields[4], sub) {
				found = append(found, fields[4])
				break
			}
		}
	}
	return found, nil
}

// NodeAction runs hack/cluster/node.sh NODE ACTION (stop, start, freeze,
// thaw, cut, restore; poweroff and boot for a VM node): node loss and its
// undo. A VM's boot (and start, which boots it when off) waits for the
// guest and its kubelet under TCG: up to 15 minutes, as berth dev up's
// waits with VM nodes.
func (e Env) NodeAction(ctx context.Context, node, action string) error {
	script := filepath.Join(repoRoot(), "hack", "cluster", "node.sh")
	limit := 3 * time.Minute
	if kind, _ := e.nodeVar("NODE_KIND", node); kind == "vm" && (action == "boot" || action == "start") {
		limit = 15 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, script, node, action)
	cmd.Env = append(os.Environ(), "BERTH_E2E_DIR="+e.Vars["BERTH_E2E_DIR"])
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("node.sh %s %s: %w: %s", node, action, err, out)
	}
	return nil
}

// vmNode is the name of the cluster's first VM node (NODE_KIND_<i>=vm: a
// qemu guest with a stock distribution kernel, hack/vm); the test skips on
// a cluster without one, saying why.
func (e Env) vmNode(t *testing.T) string {
	t.Helper()
	if vms := e.vmNodes(); len(vms) > 0 {
		return vms[0]
	}
	if n := os.Getenv("BERTH_E2E_VM_NODES"); n != "" && n != "0" {
		t.Fatalf("BERTH_E2E_VM_NODES=%s, but the cluster's cluster.env names no VM node (NODE_KIND_<i>=vm): a cluster without one was reused?", n)
	}
	t.Skip("no VM node: this scenario needs a stock kernel's NFS client, nbd or a real power-off (BERTH_E2E_VM_NODES=1)")
	return ""
}

// vmNodes are the names of the cluster's VM nodes (NODE_KIND_<i>=vm), in
// cluster.env's order.
func (e Env) vmNodes() []string {
	var vms []string
	for i := 1; e.Vars[fmt.Sprintf("NODE_NAME_%d", i)] != ""; i++ {
		if e.Vars[fmt.Sprintf("NODE_KIND_%d", i)] == "vm" {
			vms = append(vms, e.Vars[fmt.Sprintf("NODE_NAME_%d", i)])
		}
	}
	return vms
}

// netnsNode is the name of the cluster's first node that shares this
// machine's kernel (NODE_KIND_<i>=netns, or a cluster.env without kinds).
func (e Env) netnsNode(t *testing.T) string {
	t.Helper()
	for i := 1; e.Vars[fmt.Sprintf("NODE_NAME_%d", i)] != ""; i++ {
		if e.Vars[fmt.Sprintf("NODE_KIND_%d", i)] != "vm" {
			return e.Vars[fmt.Sprintf("NODE_NAME_%d", i)]
		}
	}
	t.Fatal("no netns node in the cluster")
	return ""
}

// vmExec runs script with sh as root in the VM node (hack/vm/exec.sh) and
// returns its output.
func (e Env) vmExec(ctx context.Context, node, script string) (string, error) {
	return e.vmExecFor(ctx, node, script, 0)
}

// vmExecFor is vmExec with exec.sh's own limit raised to limit (0: its
// default, 10 minutes).
func (e Env) vmExecFor(ctx context.Context, node, script string, limit time.Duration) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(repoRoot(), "hack", "vm", "exec.sh"), node, "sh", "-c", script)
	cmd.Env = append(os.Environ(), "BERTH_E2E_DIR="+e.Vars["BERTH_E2E_DIR"])
	if limit > 0 {
		cmd.Env = append(cmd.Env, fmt.Sprintf("VM_EXEC_TIMEOUT=%d", int(limit.Seconds())))
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("exec in %s: %w: %s", node, err, out)
	}
	return string(out), nil
}

// nodesReady says in one line whether each node is Ready, and why not.
// It uses a context of its own: it runs when the scenario's may be over.
func (s *scenario) nodesReady() string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nodes, err := s.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "cannot list: " + err.Error()
	}
	var parts []string
	for _, n := range nodes.Items {
		state := "Ready=?"
		for _, c := range n.Status.Conditions {
			if c.Type != corev1.NodeReady {
				continue
			}
			state = "Ready=" + string(c.Status)
			if c.Status != corev1.ConditionTrue {
				state += fmt.Sprintf(" since %s (%s: %s)", c.LastTransitionTime.UTC().Format(time.TimeOnly), c.Reason, c.Message)
			}
		}
		parts = append(parts, n.Name+" "+state)
	}
	return strings.Join(parts, "; ")
}

// logConsoles logs the end of each VM node's serial console (hack/vm
// keeps it in the node's logs/qemu.log), its last line leading: a guest
// kernel's oops or a hung boot shows there, and nowhere in the API.
func (s *scenario) logConsoles() {
	for _, name := range s.env.vmNodes() {
		path := filepath.Join(s.env.Vars["BERTH_E2E_DIR"], "nodes", name, "logs", "qemu.log")
		data, err := os.ReadFile(path)
		if err != nil {
			s.t.Logf("console of %s: %v", name, err)
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		lines = lines[max(0, len(lines)-60):]
		s.t.Logf("console of %s ends %q; its last %d lines (%s):\n%s", name, lines[len(lines)-1], len(lines), path, strings.Join(lines, "\n"))
	}
}
