//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// A process of another pod on the node holds the volume's device open: the
// user pod goes, but the unstage waits, with a DeviceHeldOpen Event that
// names the holder, and leaves the staging mount and device in place. Once
// the holder is gone the unstage completes and nothing is left.
func testDeviceHeldOpenBlocksUnstage(t *testing.T) {
	s := newScenario(t, 8*time.Minute)
	s.pvc("held", "berth", "32Mi", corev1.ReadWriteOnce, false)
	volume := s.boundPV("held").Spec.CSI.VolumeHandle
	s.pod("user", "echo hi > /data/f && sync && exec sleep 3600", claimSource("held"), false)
	s.running("user")
	dev, staging := s.stagedOn(volume)
	if !strings.HasPrefix(dev, "/dev/") || staging == "" {
		t.Fatalf("Attachment of %s: device %q, staging path %q", volume, dev, staging)
	}

	// The holder opens the device node from the host's /dev, as any tool on
	// the node could: no mount of it shows, only its open file.
	holder := s.podWith("holder", "exec 3<"+filepath.Join("/host-dev", filepath.Base(dev))+" && exec sleep 3600",
		corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/dev"}}, false, func(p *corev1.Pod) {
			c := &p.Spec.Containers[0]
			c.VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/host-dev"}}
			c.SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		})
	holder = s.running(holder.Name)
	s.deletePod("user")

	msgs := s.waitEvents("", "Volume", volume, 3*time.Minute, "DeviceHeldOpen")
	all := strings.Join(msgs, "\n")
	if !strings.Contains(all, "(sleep)") || !strings.Contains(all, string(holder.UID)) || !strings.Contains(all, dev) {
		t.Errorf("Volume events %q do not name the device %s, the command and the holder pod %s", msgs, dev, holder.UID)
	}
	if pv := strings.Join(s.clusterEvents("PersistentVolume", volume), "\n"); !strings.Contains(pv, "DeviceHeldOpen") {
		t.Errorf("PV events %q: no DeviceHeldOpen", pv)
	}
	if d, st := s.stagedOn(volume); d != dev || st != staging || len(s.nodeMounts(staging)) == 0 {
		t.Fatalf("after the refused unstage: device %q, staging %q, mounts %v; want everything in place", d, st, s.nodeMounts(staging))
	}

	s.deletePod("holder")
	s.waitFor("unstage after the holder went", 4*time.Minute, func(context.Context) (bool, error) {
		d, _ := s.stagedOn(volume)
		return d == "" && len(s.nodeMounts(staging)) == 0, nil
	})
	// A detach of a device that something still has open for a moment
	// (udev's probe after the unmount) is left to the kernel (autoclear),
	// which frees it on the last close.
	if seen, ok := s.settles(time.Minute, func() (string, bool) {
		b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
		return string(b), err != nil || !strings.Contains(string(b), volume)
	}); !ok {
		t.Errorf("%s is still attached to %q after the unstage", dev, strings.TrimSpace(seen))
	}
}

// stagedOn reads the volume's device and staging path on the scenario's
// node from its Attachment status ("" when not staged there).
func (s *scenario) stagedOn(volume string) (device, staging string) {
	s.t.Helper()
	q := `{.status.nodes[?(@.node=="` + s.node + `")]}`
	dev, _ := s.kubectl("get", "attachments.berth.io", volume, "-o", "jsonpath="+strings.Replace(q, "]}", "].devicePath}", 1))
	st, _ := s.kubectl("get", "attachments.berth.io", volume, "-o", "jsonpath="+strings.Replace(q, "]}", "].stagingPath}", 1))
	if strings.Contains(dev, "Error") || strings.Contains(dev, "error") {
		return "", ""
	}
	return strings.TrimSpace(dev), strings.TrimSpace(st)
}
