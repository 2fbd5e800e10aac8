//go:build e2e

package e2e

import (
	"context"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-io/berth/internal/controller/sharemanager"
)

// testCephReadWriteManyShareNodeLost: an RWX claim of the ceph class is
// served by its share manager on node X (the other node cordoned while it
// starts); a probe on node Y writes and keeps a file. Node X is lost
// (stopped) and tainted out-of-service: the share manager's Lease lapses,
// the controller force-deletes its pod and a new one, steered away from X,
// serves on Y, where a probe verifies the kept file and writes again. Node
// X back: nothing of the volume is left there (mounts, its loop device) and
// the share keeps serving.
func testCephReadWriteManyShareNodeLost(t *testing.T) {
	s := newScenario(t, 14*time.Minute)
	s.needBerthImage()
	nodes := s.env.Nodes()
	if len(nodes) < 2 {
		t.Skip("one node: node loss needs a second node (BERTH_E2E_NODES=2)")
	}
	cluster := s.cephCluster()
	nodeX, nodeY := s.lossNodes(nodes)
	s.node = nodeY
	s.pvc("shared", cluster+"-userspace", "64Mi", corev1.ReadWriteMany, false)
	pv := s.boundPV("shared")
	vol := pv.Spec.CSI.VolumeHandle
	t.Cleanup(func() {
		_, _ = s.kubectl("uncordon", nodeY)
		_ = s.env.NodeAction(context.Background(), nodeX, "start")
		_, _ = s.kubectl("taint", "node", nodeX, corev1.TaintNodeOutOfService+"-")
	})

	// The share starts on X: Y takes no new pods meanwhile.
	if out, err := s.kubectl("cordon", nodeY); err != nil {
		t.Fatalf("cordon: %v: %s", err, out)
	}
	s.keepShareRunning(vol,
		[]string{"-n", berthNamespace, "get", "sharemanager", vol, "-o", "yaml"},
		[]string{"get", "volumeattachments", "-o", "wide"},
		[]string{"-n", berthNamespace, "logs", "--tail=80", "-l", "app.kubernetes.io/component=operator"})
	first := s.shareRunning(vol, "")
	if out, err := s.kubectl("uncordon", nodeY); err != nil {
		t.Fatalf("uncordon: %v: %s", err, out)
	}
	if first.Spec.NodeName != nodeX {
		t.Fatalf("share manager %s runs on %s, want %s", first.Name, first.Spec.NodeName, nodeX)
	}
	// The loop devices of one node's share: the agent's over the FUSE file
	// and the one kubelet holds over the pod's device.
	loops := s.volumeLoops(vol)
	t.Logf("loop devices of %s with the share on X: %q", vol, loops)
	if len(loops) == 0 {
		t.Errorf("no loop device backs %s with the share on X", vol)
	}
	endpoint := sharemanager.Endpoint(berthNamespace, vol)
	before := s.probeOn(nodeY, "probe-1", endpoint, "--keep", "before")
	sum := regexp.MustCompile(`(?m)^kept before sha256 ([0-9a-f]{64})$`).FindStringSubmatch(before)
	if sum == nil {
		t.Fatalf("probe printed no kept checksum:\n%s", before)
	}

	start := time.Now()
	if err := s.env.NodeAction(s.ctx, nodeX, "stop"); err != nil {
		t.Fatal(err)
	}
	stopped := time.Since(start)
	// Known to be down (stopped): tainted at once, as an admin who knows does.
	if out, err := s.kubectl("taint", "node", nodeX, corev1.TaintNodeOutOfService+"=nodeshutdown:NoExecute"); err != nil {
		t.Fatalf("taint: %v: %s", err, out)
	}
	second := s.shareRunning(vol, first.UID)
	running := time.Since(start)
	xLoops := loopDevices(loops)
	yLoops := map[string]bool{}
	for _, d := range loopDevices(s.volumeLoops(vol)) {
		yLoops[d] = !slices.Contains(xLoops, d)
	}
	if second.Spec.NodeName != nodeY {
		t.Errorf("the new share manager runs on %s, want %s", second.Spec.NodeName, nodeY)
	}
	after := s.probeOn(nodeY, "probe-2", endpoint, "--verify", "before="+sum[1], "--keep", "after", "--timeout", "2m")
	t.Logf("node X (%s) stopped in %s: the share ran on %s after %s, the probe through it verified and wrote after %s",
		nodeX, stopped.Round(10*time.Millisecond), second.Spec.NodeName, running.Round(10*time.Millisecond),
		time.Since(start).Round(10*time.Millisecond))
	if !strings.Contains(after, "verified before sha256 "+sum[1]) {
		t.Fatalf("second probe did not verify the first one's file:\n%s", after)
	}
	sumAfter := regexp.MustCompile(`(?m)^kept after sha256 ([0-9a-f]{64})$`).FindStringSubmatch(after)
	if sumAfter == nil {
		t.Fatalf("second probe printed no kept checksum:\n%s", after)
	}
	out, _ := s.kubectl("-n", berthNamespace, "get", "sharemanager", vol, "-o", "jsonpath={.status.failedNode} {.status.failovers}")
	t.Logf("share manager status after the loss: failedNode, failovers = %s", out)

	// X back: its agent cleans what the lost share manager left there.
	back := time.Now()
	if err := s.env.NodeAction(s.ctx, nodeX, "start"); err != nil {
		t.Fatal(err)
	}
	waitNodeReady(s.ctx, t, s.cs, nodeX, true)
	if out, err := s.kubectl("taint", "node", nodeX, corev1.TaintNodeOutOfService+"-"); err != nil {
		t.Fatalf("untaint: %v: %s", err, out)
	}
	// X's devices are followed by number: once X's mounts are gone, sysfs
	// may name their backing files only from the connection's root
	// ("/disk.img"), which a match on the volume's name would miss.
	var left []string
	s.waitFor("node X cleaned: no mount of the volume there, none of X's loop devices bound", 3*time.Minute, func(ctx context.Context) (bool, error) {
		m, err := s.env.NodeMounts(ctx, nodeX, vol)
		left = s.stillBound(xLoops, yLoops)
		return err == nil && len(m) == 0 && len(left) == 0, nil
	})
	t.Logf("node X cleaned %s after its start; loop devices of %s now: %q", time.Since(back).Round(10*time.Millisecond), vol, s.volumeLoops(vol))
	// Still the same share manager, running (a probe that timed out on
	// the busy node may have made it unready for a moment: that is no
	// failover).
	if p := s.shareRunning(vol, ""); p.UID != second.UID {
		t.Errorf("the share manager was replaced after X's return: %s, was %s", p.UID, second.UID)
	}
	third := s.probeOn(nodeY, "probe-3", endpoint, "--verify", "before="+sum[1], "--verify", "after="+sumAfter[1], "--keep", "again")
	if !strings.Contains(third, "verified after sha256 "+sumAfter[1]) {
		t.Errorf("third probe did not verify the second one's file:\n%s", third)
	}

	// Done: the share stops, the claim goes with everything it made, and
	// X's Ceph clients leave the blocklist after the cool-down.
	s.stopShareThenDeleteClaim(vol, second.Name, "shared")
	s.waitFor("volume and its share objects gone", 3*time.Minute, func(ctx context.Context) (bool, error) {
		out, err := s.kubectl("get", "volumes.berth.io/"+vol, "pv/"+pv.Name, "pv/"+sharemanager.Name(vol), "--ignore-not-found", "-o", "name")
		return err == nil && strings.TrimSpace(out) == "" && len(s.volumeLoops(vol)) == 0 &&
			len(s.stillBound(append(xLoops, slices.Collect(maps.Keys(yLoops))...), nil)) == 0, nil
	})
	s.waitFor("node X's Ceph clients off the blocklist after the cool-down", 3*time.Minute, func(context.Context) (bool, error) {
		out, err := s.kubectl("get", "nodecleanups.berth.io", nodeX, "--ignore-not-found", "-o", "jsonpath={.spec.blocklisted[*].address}")
		return err == nil && strings.TrimSpace(out) == "", nil
	})
}

// loopDevices are the device names (loopN) of volumeLoops' entries.
func loopDevices(entries []string) []string {
	var devs []string
	for _, e := range entries {
		dev, _, _ := strings.Cut(e, ":")
		devs = append(devs, dev)
	}
	return devs
}

// stillBound lists those of devs that are bound to a backing file, leaving
// out the numbers the kernel gave to mine (free once, then reused).
func (s *scenario) stillBound(devs []string, mine map[string]bool) []string {
	var bound []string
	for _, d := range devs {
		if mine[d] {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/sys/block", d, "loop", "backing_file"))
		switch {
		case err == nil:
			bound = append(bound, d+": "+strings.TrimSpace(string(b)))
		// No loop folder: free. ENXIO, ENODEV: freed while it was read
		// (this polls devices that are being detached).
		case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENXIO) || errors.Is(err, syscall.ENODEV):
		default:
			// Counted as bound: the poll asks again, and its timeout
			// says what stayed.
			s.t.Logf("backing file of %s: %v", d, err)
			bound = append(bound, d+": "+err.Error())
		}
	}
	return bound
}

// lossNodes picks the node to lose (X) and the one that stays (Y): X runs
// neither the operator (its controller must fail the share over) nor the
// CSI controller (it attaches the volume on Y) when a node allows it.
func (s *scenario) lossNodes(nodes []string) (x, y string) {
	s.t.Helper()
	busy := map[string]bool{}
	for _, sel := range []string{"app.kubernetes.io/component=operator", controllerPods} {
		pods, err := s.cs.CoreV1().Pods(berthNamespace).List(s.ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			s.t.Fatal(err)
		}
		for _, p := range pods.Items {
			busy[p.Spec.NodeName] = true
		}
	}
	x, y = nodes[len(nodes)-1], nodes[0]
	if busy[x] && !busy[y] {
		x, y = y, x
	}
	s.t.Logf("node X (lost) %s, node Y %s; operator/CSI controller on %v", x, y, busy)
	return x, y
}

// volumeLoops lists the loop devices (device: backing file) bound to a
// file named after the volume: the agent's over its FUSE file
// (<root>/<volume>/disk.img) and kubelet's over a pod's device
// (.../publish/share-manager-<volume>/<pod>). The nodes share one kernel:
// these are every node's.
func (s *scenario) volumeLoops(vol string) []string {
	s.t.Helper()
	files, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		s.t.Fatal(err)
	}
	var found []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.Contains(string(b), vol) {
			found = append(found, filepath.Base(filepath.Dir(filepath.Dir(f)))+": "+strings.TrimSpace(string(b)))
		}
	}
	return found
}
