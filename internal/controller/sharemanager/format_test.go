package sharemanager_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/testenv"
)

// neverFormatArg is the pod's --never-format value ("": none).
func neverFormatArg(pod *corev1.Pod) string {
	for _, a := range pod.Spec.Containers[0].Args {
		if v, ok := strings.CutPrefix(a, "--never-format="); ok {
			return v
		}
	}
	return ""
}

// TestShareManagerNeverFormatsARecordedVolume (F11): the first share
// manager of a blank volume may format it; once a share manager served
// it, the Volume's status records its filesystem, and every later share
// manager is told never to format it (a device that then shows nothing
// is damage, not a blank volume).
func TestShareManagerNeverFormatsARecordedVolume(t *testing.T) {
	suite.Require(t)
	const vname = "pvc-rwx-format"
	newVolume(t, vname, v1.VolumeModeFilesystem, "", v1.RWXSpec{})
	k := kubelet{t}
	useVolume(t, vname, "web-0")
	pod := sharePod(t, vname, "")
	if why := neverFormatArg(pod); why != "" {
		t.Errorf("first share manager of a blank volume told never to format: %q", why)
	}
	serve(t, k, vname, pod, "node-a")
	testenv.Eventually(t, waitLimit, "format recorded in "+vname, func(ctx context.Context) (bool, error) {
		vol := &v1.Volume{}
		err := env.Client.Get(ctx, client.ObjectKey{Name: vname}, vol)
		return err == nil && vol.Status.Formatted != nil && vol.Status.Formatted.FSType == "ext4", err
	})

	k.status(pod, corev1.PodFailed, false)
	next := sharePod(t, vname, pod.UID)
	if why := neverFormatArg(next); !strings.Contains(why, "records a ext4 filesystem") {
		t.Errorf("share manager after one served: --never-format=%q in %v, want the recorded filesystem", why, next.Spec.Containers[0].Args)
	}
	if !slices.Contains(next.Spec.Containers[0].Args, "--share-manager="+vname) {
		t.Errorf("args %v", next.Spec.Containers[0].Args)
	}
}
