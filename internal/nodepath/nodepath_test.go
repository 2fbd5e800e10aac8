package nodepath

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-io/berth/internal/flexvolume"
)

// TestCheckStats: a block volume's usage is asked at kubelet's bind mount
// of its device for a pod, which no other request may name.
func TestCheckStats(t *testing.T) {
	r, err := New("/var/lib/kubelet", "/var/lib/berth/flex-staging")
	if err != nil {
		t.Fatal(err)
	}
	const k = "/var/lib/kubelet"
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{k + "/plugins/kubernetes.io/csi/volumeDevices/pvc-1/dev/0b5e-11", true},
		{k + "/pods/0b5e-11/volumes/kubernetes.io~csi/pvc-1/mount", true},
		{k + "/plugins/kubernetes.io/csi/volumeDevices/pvc-1/dev", false},
		{k + "/plugins/kubernetes.io/csi/volumeDevices/pvc-1/dev/0b5e-11/x", false},
		{k + "/plugins/kubernetes.io/csi/volumeDevices/pvc-1/data/0b5e-11", false},
		{k + "/plugins/kubernetes.io/csi/volumeDevices/pvc-1/dev/..", false},
		{k + "/plugins/kubernetes.io/csi/volumeDevices/nospec/dev/a\x00b", false},
		{k + "/plugins/other/csi/volumeDevices/pvc-1/dev/0b5e-11", false},
		{"/etc", false},
	} {
		checkCase(t, "CheckStats", r.CheckStats, tc.path, tc.ok)
	}
}

// checkCase checks that check accepts path (ok) or refuses it.
func checkCase(t *testing.T, name string, check func(string) error, path string, ok bool) {
	t.Helper()
	err := check(path)
	if ok && err != nil {
		t.Errorf("%s(%q) = %v, want accepted", name, path, err)
	}
	if !ok && !errors.Is(err, ErrRefused) {
		t.Errorf("%s(%q) = %v, want ErrRefused", name, path, err)
	}
}

// kubeletShapes are the exact paths kubelet and berth make (kubelet root
// /var/lib/kubelet, Flexvolume staging root /var/lib/berth/flex-staging):
// both Check and CheckRecorded accept them.
var kubeletShapes = []string{
	"/var/lib/kubelet/pods/0b5e-11/volumes/kubernetes.io~csi/pvc-1/mount",
	"/var/lib/kubelet/pods/0b5e-11/volumes/berth.io~berth/data",
	"/var/lib/kubelet/pods/0b5e-11/volumeDevices/kubernetes.io~csi/pvc-1",
	"/var/lib/kubelet/plugins/kubernetes.io/csi/berth.io/3f2a/globalmount",
	"/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/staging/pvc-1",
	"/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pvc-1/0b5e-11",
	"/var/lib/berth/flex-staging/vol-a",
}

// testRule is the Rule of kubeletShapes' roots.
func testRule(t *testing.T) Rule {
	t.Helper()
	r, err := New("/var/lib/kubelet", "/var/lib/berth/flex-staging")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestCheck(t *testing.T) {
	r := testRule(t)
	for _, p := range kubeletShapes {
		checkCase(t, "Check", r.Check, p, true)
	}
	const k = "/var/lib/kubelet"
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{"/var/lib/berth/flex-staging/vol-a/device", true},

		{"", false},
		{"relative/pods/x", false},
		{k + "/pods/0b5e-11/volumes/berth.io~berth/../../../../../etc", false},
		{k + "/pods/0b5e-11/volumes/berth.io~berth/data/", false},
		{k + "/pods/0b5e-11/volumes//berth.io~berth/data", false},
		{k + "/pods/0b5e-11/volumes/./berth.io~berth/data", false},
		{k + "/pods/0b5e-11/volumes/berth.io~berth/da\x00ta", false},
		{"/", false},
		{"/etc", false},
		{"/var/lib/berth/volumes/vol-a.img", false},   // berth's images: never unmounted or removed
		{"/var/lib/berth/flex-staging", false},        // the root itself
		{"/var/lib/berth/flex-staging-evil/x", false}, // a sibling sharing the prefix
		{k, false},                   // kubelet's root
		{k + "/pods/0b5e-11", false}, // a pod's folder
		{k + "/pods/0b5e-11/volumes/berth.io~berth", false},                 // a plugin's folder
		{k + "/pods/0b5e-11/etc-hosts/a/b", false},                          // not a volume folder
		{k + "/plugins/kubernetes.io/csi/other.io/3f2a/globalmount", false}, // another driver
		{k + "/plugins/kubernetes.io/csi/volumeDevices/staging", false},
		{k + "/plugins_registry/berth.io-reg.sock", false},
		{k + "x/pods/0b5e-11/volumes/berth.io~berth/data", false},                 // sibling of kubelet's root
		{k + "/plugins/kubernetes.io/csi/volumeDevices/pvc-1/dev/0b5e-11", false}, // a block volume's usage only
	} {
		checkCase(t, "Check", r.Check, tc.path, tc.ok)
	}
}

// TestCheckRecorded (F6): a path an API object recorded is accepted only
// in the exact shapes kubelet and berth make, never below them, where a
// pod's content (an emptyDir's files, a staged volume's root) could put a
// symlink after the check.
func TestCheckRecorded(t *testing.T) {
	r := testRule(t)
	for _, p := range kubeletShapes {
		checkCase(t, "CheckRecorded", r.CheckRecorded, p, true)
	}
	const k = "/var/lib/kubelet"
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{k + "/pods/0b5e-11/volumes/kubernetes.io~empty-dir/scratch/link/pvc-x.img", false}, // the review's attack
		{k + "/pods/0b5e-11/volumes/kubernetes.io~csi/pvc-1/mount/dir", false},
		{k + "/pods/0b5e-11/volumes/kubernetes.io~csi/pvc-1", false},
		{k + "/pods/0b5e-11/volumes/kubernetes.io~csi/pvc-1/other", false},
		{k + "/pods/0b5e-11/volumes/berth.io~berth/data/f", false},
		{k + "/pods/0b5e-11/volumeDevices/kubernetes.io~csi/pvc-1/x", false},
		{k + "/plugins/kubernetes.io/csi/berth.io/3f2a/globalmount/lost+found", false},
		{k + "/plugins/kubernetes.io/csi/berth.io/3f2a", false},
		{k + "/plugins/kubernetes.io/csi/volumeDevices/staging/pvc-1/x", false},
		{k + "/plugins/kubernetes.io/csi/volumeDevices/publish/pvc-1", false},
		{"/var/lib/berth/flex-staging/vol-a/device", false},
		{"/etc", false},
		{k + "/pods/0b5e-11/volumes/kubernetes.io~secret/token", false},      // another plugin's volume
		{k + "/pods/0b5e-11/volumes/kubernetes.io~empty-dir/scratch", false}, // a pod's emptyDir
		{k + "/pods/0b5e-11/volumes/other.io~driver/data", false},            // another Flexvolume driver's
		{k + "/pods/0b5e-11/volumeDevices/other.io~driver/pvc-1", false},
	} {
		checkCase(t, "CheckRecorded", r.CheckRecorded, tc.path, tc.ok)
	}
}

func TestZeroRuleRefusesAll(t *testing.T) {
	if err := (Rule{}).Check("/var/lib/kubelet/pods/u/volumes/p/n"); !errors.Is(err, ErrRefused) {
		t.Fatalf("zero Rule accepted a path: %v", err)
	}
	r, err := New("", "/srv/berth/flex-staging")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Check("/var/lib/kubelet/pods/u/volumes/p/n"); !errors.Is(err, ErrRefused) {
		t.Fatalf("no kubelet root, yet a kubelet path was accepted: %v", err)
	}
}

func TestNew(t *testing.T) {
	for _, bad := range [][2]string{{"kubelet", ""}, {"/", ""}, {"", "staging"}, {"", "/"}} {
		if _, err := New(bad[0], bad[1]); !errors.Is(err, ErrRefused) {
			t.Errorf("New(%q, %q) = %v, want ErrRefused", bad[0], bad[1], err)
		}
	}
	r, err := New("/var/lib/kubelet/", "")
	if err != nil || r.KubeletRoot() != "/var/lib/kubelet" {
		t.Errorf("New with a trailing /: %q %v", r.KubeletRoot(), err)
	}
}

// TestSymlinks: a symlink anywhere below the root is refused, on a real
// folder tree; a path whose tail does not exist yet is fine.
func TestSymlinks(t *testing.T) {
	root := t.TempDir()
	kubelet, outside := filepath.Join(root, "kubelet"), filepath.Join(root, "outside")
	pluginDir := filepath.Join(kubelet, "pods", "uid-1", "volumes", "berth.io~berth")
	for _, d := range []string{pluginDir, filepath.Join(outside, "volumes", "berth.io~berth", "data"), filepath.Join(kubelet, "pods", "uid-3", "volumes")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A pod folder that is a link to elsewhere, a mount dir that is a link,
	// and a link at the plugin level.
	links := map[string]string{
		filepath.Join(kubelet, "pods", "uid-2"):                              outside,
		filepath.Join(pluginDir, "data"):                                     outside,
		filepath.Join(kubelet, "pods", "uid-3", "volumes", "berth.io~berth"): filepath.Join(outside, "volumes", "berth.io~berth"),
	}
	for link, target := range links {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	r, err := New(kubelet, filepath.Join(root, "staging"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{
		filepath.Join(kubelet, "pods", "uid-2", "volumes", "berth.io~berth", "data"),
		filepath.Join(pluginDir, "data"),
		filepath.Join(pluginDir, "data", "sub"),
		filepath.Join(kubelet, "pods", "uid-3", "volumes", "berth.io~berth", "data"),
	} {
		err := r.Check(p)
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "symlink") {
			t.Errorf("Check(%q) = %v, want a symlink refusal", p, err)
		}
	}
	for _, p := range []string{
		filepath.Join(pluginDir, "new-volume"),            // does not exist yet
		filepath.Join(root, "staging", "vol-a", "device"), // staging root not made yet
	} {
		if err := r.Check(p); err != nil {
			t.Errorf("Check(%q) = %v, want accepted", p, err)
		}
	}
}

func TestFlexMountDir(t *testing.T) {
	r, err := New("/var/lib/kubelet", "/var/lib/berth/flex-staging")
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.FlexMountDir("/var/lib/kubelet/pods/0b5e-11/volumes/berth.io~berth/data", "berth.io~berth")
	if err != nil || got != (PodVolume{PodUID: "0b5e-11", Name: "data"}) {
		t.Errorf("FlexMountDir = %+v, %v", got, err)
	}
	for _, p := range []string{
		"/var/lib/kubelet/pods/0b5e-11/volumes/berth.io~berth/data/sub",        // deeper
		"/var/lib/kubelet/pods/0b5e-11/volumes/kubernetes.io~csi/data",         // another plugin
		"/var/lib/kubelet/pods/0b5e-11/volumeDevices/berth.io~berth/data",      // not volumes
		"/var/lib/berth/flex-staging/data",                                     // staging
		"/var/lib/kubelet/pods/0b5e-11/volumes/berth.io~berth/../../x/volumes", // not clean
	} {
		if _, err := r.FlexMountDir(p, "berth.io~berth"); !errors.Is(err, ErrRefused) {
			t.Errorf("FlexMountDir(%q) = %v, want ErrRefused", p, err)
		}
	}
}

// The Flexvolume folder CheckRecorded accepts is the driver's.
func TestFlexPluginIsTheDriversDir(t *testing.T) {
	if flexPlugin != flexvolume.Dir {
		t.Fatalf("nodepath's Flexvolume folder %q, the driver's %q", flexPlugin, flexvolume.Dir)
	}
}
