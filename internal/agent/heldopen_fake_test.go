package agent

import (
	"fmt"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/mount"
)

// A refused unstage for a held-open device is told on the Volume and on
// the PV whose handle is the volume; other refusals emit nothing.
func TestReportHeldOpen(t *testing.T) {
	vol := &v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-1"}}
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-1"}, Spec: corev1.PersistentVolumeSpec{
		PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "berth.io", VolumeHandle: "pvc-1"}}}}
	rec := record.NewFakeRecorder(10)
	a := newTestAgent(t, Config{Node: "n1", API: fakeAPI(t, vol, pv).Build(), Log: testr.New(t), Events: rec})

	a.reportHeldOpen(t.Context(), "pvc-1", fmt.Errorf("unstage: %w", mount.ErrInUse))
	held := &mount.HeldOpenError{Device: "/dev/loop3", Holders: []mount.Holder{{PID: 4242, Command: "sleep", PodUID: "u-1"}}}
	a.reportHeldOpen(t.Context(), "pvc-1", fmt.Errorf("unstage /s: %w", held))
	close(rec.Events)
	var got []string
	for e := range rec.Events {
		got = append(got, e)
	}
	if len(got) != 2 {
		t.Fatalf("events %q: want one on the Volume and one on the PV", got)
	}
	for _, e := range got {
		if !strings.HasPrefix(e, "Warning DeviceHeldOpen ") || !strings.Contains(e, "pid 4242 (sleep) in pod u-1") || !strings.Contains(e, "n1") {
			t.Errorf("event %q does not name the reason, node and holder", e)
		}
	}
}
