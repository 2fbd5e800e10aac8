package sanity

import (
	"os"
	"path/filepath"
	"testing"
)

// kubeletRoot is the agent's kubelet root: the agent stages and publishes
// only under kubelet's folders for CSI volumes there.
func kubeletRoot() string { return filepath.Join(work, "kubelet") }

// kubeletDirs returns a fresh staging path and pod target path shaped as
// kubelet makes them; the target's parent exists.
func kubeletDirs(t *testing.T) (staging, target string) {
	t.Helper()
	stages := filepath.Join(kubeletRoot(), "plugins", "kubernetes.io", "csi", "berth.io")
	pods := filepath.Join(kubeletRoot(), "pods")
	for _, d := range []string{stages, pods} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	s, err := os.MkdirTemp(stages, "vol-")
	if err != nil {
		t.Fatal(err)
	}
	p, err := os.MkdirTemp(pods, "uid-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(s); _ = os.RemoveAll(p) })
	target = filepath.Join(p, "volumes", "kubernetes.io~csi", "pv", "mount")
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(s, "globalmount"), target
}
