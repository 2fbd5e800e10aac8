//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// testNodeLossAndReturn drives hack/cluster/node.sh on the last node: cut
// off the hub, the node goes NotReady; restored, Ready again. Stopped, its
// kubelet, containerd and pods' processes are gone; started, Ready again.
func testNodeLossAndReturn(t *testing.T) {
	env, cs := needCluster(t)
	nodes := env.twoNodes(t)
	node := nodes[len(nodes)-1]
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	// Whatever happens, the node comes back for the tests after this one.
	t.Cleanup(func() {
		for _, a := range []string{"thaw", "restore", "start"} {
			if err := env.NodeAction(context.Background(), node, a); err != nil {
				t.Errorf("undo: %v", err)
			}
		}
	})

	step := func(action string, ready bool) {
		t.Helper()
		start := time.Now()
		if err := env.NodeAction(ctx, node, action); err != nil {
			t.Fatal(err)
		}
		waitNodeReady(ctx, t, cs, node, ready)
		t.Logf("%s %s: Ready=%t after %v", action, node, ready, time.Since(start).Round(time.Second))
	}
	step("cut", false)
	step("restore", true)

	pidFile := filepath.Join(env.Vars["BERTH_E2E_DIR"], "pids", "kubelet-"+node+".pid")
	pid := readPID(t, pidFile)
	step("stop", false)
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
		t.Errorf("kubelet %d of the stopped node still runs", pid)
	}
	step("start", true)
}

func readPID(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("pid file: %v", err)
	}
	pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if err != nil {
		t.Fatalf("pid file %s: %v", path, err)
	}
	return pid
}

// waitNodeReady waits for the node's Ready condition to be (or not be) True.
// NotReady takes the controller-manager's node-monitor grace period (~50 s).
func waitNodeReady(ctx context.Context, t *testing.T, cs kubernetes.Interface, node string, ready bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, tolerant(t, func(ctx context.Context) (bool, error) {
		n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return (c.Status == corev1.ConditionTrue) == ready, nil
			}
		}
		return !ready, nil
	}))
	if err != nil {
		t.Fatalf("node %s Ready=%t: %v", node, ready, err)
	}
}
