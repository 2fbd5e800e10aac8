//go:build e2e

package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// testVMCephKernelMounter (#33, krbd): the kernel class of the ceph
// StorageCluster on the VM node, whose kernel has the rbd driver. A pod
// writes through the kernel's mapping (/dev/rbdN, with a Ceph client of
// its own, recorded in the Attachment's status before the device is
// used). The VM loses power and is tainted out-of-service; the lost pod is
// force-deleted and a new one waits for the VM. Once it boots, the old
// stage is gone with the old kernel: the new pod's stage maps the image
// anew, with a new client that takes the image's lock over from the dead
// one, and reads the data fsync'd before the power loss. Deleting the
// claim leaves nothing mapped, mounted or recorded. The netns nodes' kernel
// has no rbd driver, so the volume cannot move to one: the data is read
// back on the VM.
func testVMCephKernelMounter(t *testing.T) {
	env, _ := needCluster(t)
	vm := env.vmNode(t)
	s := newScenario(t, 15*time.Minute)
	cluster := s.cephCluster()
	s.node = vm
	s.pvc("data", cluster, "64Mi", corev1.ReadWriteOnce, false)
	pv := s.boundPV("data")
	volume := pv.Spec.CSI.VolumeHandle
	s.pod("writer", writeChecked, claimSource("data"), false)
	s.checked("writer", "written")
	old, device := s.krbdStage(vm, volume, nil)
	t.Logf("%s maps %s as %s, Ceph client %v", vm, volume, device, old)

	s.powerOff(vm)
	s.taintOutOfService(vm)
	zero := int64(0)
	if err := s.cs.CoreV1().Pods(s.ns).Delete(s.ctx, "writer", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	s.podWith("reader", verifyChecked, claimSource("data"), false, func(p *corev1.Pod) {
		p.Spec.Tolerations = []corev1.Toleration{{Key: corev1.TaintNodeOutOfService, Operator: corev1.TolerationOpExists}}
	})
	s.bootAgain(vm)
	s.checked("reader", "/data/f: OK")
	clients, _ := s.krbdStage(vm, volume, old)
	t.Logf("after the boot: Ceph client %v; the dead client %v on the blocklist: %t", clients, old, len(s.blocklisted(old)) > 0)

	s.deletePod("reader")
	if err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Delete(s.ctx, "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitFor("nothing of the volume left on "+vm, 3*time.Minute, func(context.Context) (bool, error) {
		return len(s.vmRBDMappings(vm)) == 0 && len(s.vmMounts(vm, volume)) == 0 && len(s.vmRecords(vm, volume)) == 0, nil
	})
}

// krbdStage waits until the Attachment's status names node's Ceph client
// of volume (one that is not in before) and its device, checks that the
// device is the node's one krbd mapping, and returns them.
func (s *scenario) krbdStage(node, volume string, before []string) (clients []string, device string) {
	s.t.Helper()
	s.waitFor("the Ceph client and device of "+node+" in the Attachment's status", 2*time.Minute, func(context.Context) (bool, error) {
		out, err := s.kubectl("get", "attachments.berth.io", volume, "-o",
			`jsonpath={.status.nodes[?(@.node=="`+node+`")].cephClients[*]}{"|"}{.status.nodes[?(@.node=="`+node+`")].devicePath}`)
		c, d, _ := strings.Cut(out, "|")
		clients, device = strings.Fields(c), d
		return err == nil && len(clients) > 0 && !slices.Equal(clients, before), nil
	})
	if !strings.HasPrefix(device, "/dev/rbd") {
		s.t.Fatalf("%s staged on %s as %q, want a krbd device (/dev/rbdN)", volume, node, device)
	}
	if m := s.vmRBDMappings(node); len(m) != 1 || !strings.HasSuffix(m[0], "-"+volume) {
		s.t.Fatalf("rbd mappings on %s: %v, want the volume's one", node, m)
	}
	return clients, device
}

// vmRBDMappings are the VM node's krbd mappings, as POOL/IMAGE.
func (s *scenario) vmRBDMappings(node string) []string {
	out, err := s.vmExec(node, `for d in /sys/bus/rbd/devices/*; do [ -e "$d/pool" ] && echo "$(cat $d/pool)/$(cat $d/name)"; done; true`)
	if err != nil {
		s.t.Fatalf("rbd mappings on %s: %v", node, err)
	}
	return strings.Fields(out)
}
