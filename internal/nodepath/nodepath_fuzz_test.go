package nodepath

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzCheck: whatever path arrives (from kubelet or an API object), one
// accepted by Check or CheckStats is clean, absolute and strictly inside one of the Rule's
// roots, has no "." or ".." component, and no component of it that exists
// is a symlink; FlexMountDir accepts only kubelet's exact mount dir shape
// and returns its UID and name; CheckRecorded accepts only what Check does,
// never deeper than kubelet's deepest volume folder. The roots are in a temp folder that holds
// symlinks where a planted one would redirect an unmount. Seeds are the
// paths kubelet and berth use (TestCheck's).
func FuzzCheck(f *testing.F) {
	for _, p := range []string{
		"/var/lib/kubelet/pods/0b5e-11/volumes/kubernetes.io~csi/pvc-1/mount",
		"/var/lib/kubelet/pods/0b5e-11/volumes/berth.io~berth/data",
		"/var/lib/kubelet/pods/0b5e-11/volumeDevices/kubernetes.io~csi/pvc-1",
		"/var/lib/kubelet/plugins/kubernetes.io/csi/berth.io/3f2a/globalmount",
		"/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/staging/pvc-1",
		"/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pvc-1/0b5e-11",
		"/var/lib/berth/flex-staging/vol-a/device",
		"/var/lib/kubelet/pods/0b5e-11/volumes/berth.io~berth/../../../../../etc",
		"/var/lib/kubelet/pods/evil/volumes/berth.io~berth/data",
		"/var/lib/kubelet/plugins/kubernetes.io/csi/berth.io/link/globalmount",
		"/var/lib/berth/flex-staging-evil/x",
		"/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/pvc-1/dev/0b5e-11",
		"/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/pvc-1/dev/a\x00b",
	} {
		f.Add(p)
	}
	dir := f.TempDir()
	kubelet, staging := filepath.Join(dir, "var/lib/kubelet"), filepath.Join(dir, "var/lib/berth/flex-staging")
	for _, d := range []string{kubelet + "/pods/0b5e-11/volumes/berth.io~berth/data", kubelet + "/plugins/kubernetes.io/csi/berth.io", staging} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			f.Fatal(err)
		}
	}
	for link, to := range map[string]string{
		kubelet + "/pods/evil":                                 "/",
		kubelet + "/plugins/kubernetes.io/csi/berth.io/link":   "/etc",
		kubelet + "/pods/0b5e-11/volumes/berth.io~berth/other": "../../../../..",
	} {
		if err := os.Symlink(to, link); err != nil {
			f.Fatal(err)
		}
	}
	r, err := New(kubelet, staging)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, p string) {
		p = dir + p // the roots live in dir; so do the seeds
		for name, check := range map[string]func(string) error{"Check": r.Check, "CheckStats": r.CheckStats, "CheckRecorded": r.CheckRecorded} {
			err := check(p)
			if err != nil {
				if !errors.Is(err, ErrRefused) && !strings.HasPrefix(err.Error(), "check ") {
					t.Fatalf("%s(%q) = %v: neither accepted nor refused", name, p, err)
				}
			} else {
				checkAccepted(t, p, kubelet, staging)
			}
		}
		// A recorded path is at most 7 components below kubelet's root
		// (a block volume's publish dir), 1 below berth's staging root.
		if r.CheckRecorded(p) == nil && r.Check(p) != nil {
			t.Fatalf("CheckRecorded accepted %q, which Check refuses", p)
		}
		if rel, ok := below(kubelet, p); ok && r.CheckRecorded(p) == nil && len(rel) > 7 {
			t.Fatalf("CheckRecorded accepted %q, %d components deep", p, len(rel))
		}
		pv, err := r.FlexMountDir(p, "berth.io~berth")
		if err != nil {
			return
		}
		if want := filepath.Join(kubelet, "pods", pv.PodUID, "volumes", "berth.io~berth", pv.Name); want != p ||
			pv.PodUID == "" || pv.Name == "" || strings.Contains(pv.PodUID+pv.Name, "/") || pv.PodUID == ".." || pv.Name == ".." {
			t.Fatalf("FlexMountDir(%q) = %+v: not kubelet's mount dir of that pod and name", p, pv)
		}
	})
}

func checkAccepted(t *testing.T, p, kubelet, staging string) {
	t.Helper()
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || strings.ContainsRune(p, 0) {
		t.Fatalf("Check accepted %q: not a clean absolute path", p)
	}
	root := ""
	for _, r := range []string{kubelet, staging} {
		if strings.HasPrefix(p, r+"/") {
			root = r
		}
	}
	if root == "" {
		t.Fatalf("Check accepted %q: outside %s and %s", p, kubelet, staging)
	}
	cur := root
	for _, c := range strings.Split(p[len(root)+1:], "/") {
		if c == "" || c == "." || c == ".." {
			t.Fatalf("Check accepted %q: component %q", p, c)
		}
		cur += "/" + c
		fi, err := os.Lstat(cur)
		if err != nil {
			return
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			t.Fatalf("Check accepted %q through the symlink %s", p, cur)
		}
	}
}
