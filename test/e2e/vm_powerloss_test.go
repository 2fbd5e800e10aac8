//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// testVMLocalVolumePowerLoss: a VM node with a local RWO volume in use
// loses power (qemu killed: its kernel, mounts, loop devices and page cache
// go at once, unlike a netns node's kubelet kill). The Attachment keeps the
// lost pod's hold while the node is only NotReady: berth breaks it only
// once the node is tainted out-of-service. The volume lives on the VM's
// disk, so the pod that replaces the lost one waits for the node; once it
// boots, the node's stale list is worked off (the old hold gone, the new
// pod running on its fsync'd data) and, once the claim is deleted, nothing
// of the volume is left on the VM: no loop device, no mount, no record.
func testVMLocalVolumePowerLoss(t *testing.T) {
	env, _ := needCluster(t)
	vm := env.vmNode(t) // skips before a namespace is made
	s := newScenario(t, 15*time.Minute)
	s.needBerthImage()
	s.node = vm // the claim is made for the VM, as the scheduler would
	s.pvc("local", "berth", "32Mi", corev1.ReadWriteOnce, false)
	volume := s.boundPV("local").Spec.CSI.VolumeHandle
	s.pod("holder", "echo hello > /data/f && sync /data/f && echo written && exec sleep 3600", claimSource("local"), false)
	s.checked("holder", "written")
	holds := func() string {
		out, err := s.kubectl("get", "attachments.berth.io", volume, "-o", "jsonpath={.spec.holders}")
		if err != nil {
			s.t.Fatalf("holders of Attachment %s: %v", volume, err)
		}
		return out
	}
	if h := holds(); !strings.Contains(h, "/holder") {
		t.Fatalf("Attachment %s holders %q, want the holder pod's", volume, h)
	}
	lost := s.powerOff(vm)
	// NotReady alone breaks nothing: the node may be partitioned, not dead.
	time.Sleep(20 * time.Second)
	if h := holds(); !strings.Contains(h, "/holder") {
		t.Errorf("the lost pod's hold was broken %s after the power loss, with the node only NotReady: holders %q",
			time.Since(lost).Round(time.Second), h)
	}
	// Only the operator's attachment GC moves a gone pod's entry off a
	// local volume. Its interval is a day; the out-of-service taint starts
	// a burst of passes over the next minutes (fence.GC.NodeLost).
	s.taintOutOfService(vm)
	tainted := time.Now()
	zero := int64(0)
	if err := s.cs.CoreV1().Pods(s.ns).Delete(s.ctx, "holder", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	s.waitFor("the lost pod's hold moved off by the attachment GC once the pod is gone", 3*time.Minute, func(context.Context) (bool, error) {
		return !strings.Contains(holds(), "/holder"), nil
	})
	t.Logf("the lost pod's hold moved off %s after the taint", time.Since(tainted).Round(100*time.Millisecond))
	s.podWith("mover", "cat /data/f && exec sleep 3600", claimSource("local"), false, func(p *corev1.Pod) {
		p.Spec.Tolerations = []corev1.Toleration{{Key: corev1.TaintNodeOutOfService, Operator: corev1.TolerationOpExists}}
	})

	s.bootAgain(vm)
	s.running("mover")
	s.waitFor("the mover reads the data fsync'd before the power loss", 2*time.Minute, func(context.Context) (bool, error) {
		out, err := s.kubectl("-n", s.ns, "logs", "mover")
		return err == nil && strings.TrimSpace(out) == "hello", nil
	})
	s.waitFor("the Attachment holds the mover alone", 3*time.Minute, func(context.Context) (bool, error) {
		h := holds()
		return !strings.Contains(h, "/holder") && strings.Contains(h, "/mover"), nil
	})
	if n := len(s.vmLoops(vm, volume)); n != 1 {
		t.Errorf("%d loop devices of %s on %s with one pod using it, want 1", n, volume, vm)
	}

	s.deletePod("mover")
	if err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Delete(s.ctx, "local", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitFor("nothing of the volume left on "+vm, 3*time.Minute, func(context.Context) (bool, error) {
		return len(s.vmLoops(vm, volume)) == 0 && len(s.vmMounts(vm, volume)) == 0 && len(s.vmRecords(vm, volume)) == 0, nil
	})
}

// vmLoops are the VM node's loop devices whose backing file names volume.
func (s *scenario) vmLoops(node, volume string) []string {
	return s.vmLines(node, "losetup -a", volume)
}

// vmRecords are the files under the VM node's berth folders (its data
// dirs and run dir) whose path names volume.
func (s *scenario) vmRecords(node, volume string) []string {
	out, err := s.vmExec(node, "find "+s.env.need(s.t, "BERTH_E2E_DIR", "the cluster's work dir")+" /run/berth -path '*"+volume+"*' 2>/dev/null || true")
	if err != nil {
		s.t.Fatalf("records of %s on %s: %v", volume, node, err)
	}
	return strings.Fields(out)
}

// powerOff cuts the VM node's power (its kernel, mounts and devices go at
// once) and waits until it is NotReady; it returns when the power went.
// Should the scenario stop first, a cleanup boots the VM and removes an
// out-of-service taint.
func (s *scenario) powerOff(vm string) time.Time {
	s.t.Helper()
	s.t.Cleanup(func() {
		_ = s.env.NodeAction(context.Background(), vm, "boot")
		_, _ = s.kubectl("taint", "node", vm, corev1.TaintNodeOutOfService+"-")
	})
	if err := s.env.NodeAction(s.ctx, vm, "poweroff"); err != nil {
		s.t.Fatal(err)
	}
	lost := time.Now()
	waitNodeReady(s.ctx, s.t, s.cs, vm, false)
	return lost
}

// bootAgain boots the VM node, waits until it is Ready and removes the
// out-of-service taint.
func (s *scenario) bootAgain(vm string) {
	s.t.Helper()
	booted := time.Now()
	if err := s.env.NodeAction(s.ctx, vm, "boot"); err != nil {
		s.t.Fatal(err)
	}
	waitNodeReady(s.ctx, s.t, s.cs, vm, true)
	s.t.Logf("%s Ready %s after the boot", vm, time.Since(booted).Round(time.Second))
	if out, err := s.kubectl("taint", "node", vm, corev1.TaintNodeOutOfService+"-"); err != nil {
		s.t.Fatalf("untaint: %v: %s", err, out)
	}
}
