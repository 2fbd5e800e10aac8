// Package nodepath says whether a path that arrives from kubelet or from an
// API object (Attachment, NodeCleanup) may be mounted, unmounted or removed
// by the agent: only clean absolute paths inside the folders kubelet keeps
// for volumes and berth's own staging root, with no symlink on the way.
package nodepath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ErrRefused marks a path outside the folders berth may touch, or one that
// is not clean or goes through a symlink.
var ErrRefused = errors.New("path refused")

// DriverName is the CSI driver whose kubelet plugin folder berth uses.
const DriverName = "berth.io"

// Kubelet's folder names, under a pod's volumes, of the CSI plugin and of
// berth's Flexvolume driver (flexvolume.Dir; nodepath imports nothing).
const (
	csiPlugin  = "kubernetes.io~csi"
	flexPlugin = "berth.io~berth"
)

// Rule knows the node's folders. The zero Rule refuses every path.
type Rule struct {
	kubelet string // kubelet's root; "" when unknown: no kubelet path passes
	staging string // berth's Flexvolume staging root; "" when none
}

// New returns the Rule of a node whose kubelet keeps its folders under
// kubeletRoot and where berth stages Flexvolume volumes under stagingRoot.
// Either may be empty (no path under it is accepted); set ones must be
// absolute and not /.
func New(kubeletRoot, stagingRoot string) (Rule, error) {
	roots := []string{kubeletRoot, stagingRoot}
	for i, p := range roots {
		if p == "" {
			continue
		}
		if roots[i] = filepath.Clean(p); !filepath.IsAbs(p) || roots[i] == "/" {
			return Rule{}, fmt.Errorf("node folder %q must be an absolute path other than /: %w", p, ErrRefused)
		}
	}
	return Rule{kubelet: roots[0], staging: roots[1]}, nil
}

// KubeletRoot is kubelet's root folder this Rule knows.
func (r Rule) KubeletRoot() string { return r.kubelet }

// Check accepts p when it is clean, absolute, inside one of
//
//	<kubelet>/pods/<uid>/volumes/<plugin>/<name>[/...]       a pod's volume (filesystem)
//	<kubelet>/pods/<uid>/volumeDevices/<plugin>/<name>[/...] a pod's volume (block)
//	<kubelet>/plugins/kubernetes.io/csi/berth.io/<x>[/...]   berth's CSI staging
//	<kubelet>/plugins/kubernetes.io/csi/volumeDevices/{staging,publish}/<spec>[/...]
//	<staging root>/<volume>[/...]                            berth's Flexvolume staging
//
// and no existing component below the root is a symlink (so an unmount or
// removal cannot be redirected elsewhere).
func (r Rule) Check(p string) error { return r.check(p, false) }

// CheckStats is Check that also accepts the one more path kubelet asks a
// block volume's usage at, and nothing else does:
//
//	<kubelet>/plugins/kubernetes.io/csi/volumeDevices/<spec>/dev/<pod uid>
//
// (kubelet's bind mount of the device for a pod; usage reads it, never
// mounts or removes it).
func (r Rule) CheckStats(p string) error { return r.check(p, true) }

// CheckRecorded is Check for a path an API object recorded (an Attachment
// entry, a stale entry), which anyone who may write those objects could
// have forged: only the exact shapes kubelet and berth make are accepted,
//
//	<kubelet>/pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount
//	<kubelet>/pods/<uid>/volumes/berth.io~berth/<name>       (berth's Flexvolume)
//	<kubelet>/pods/<uid>/volumeDevices/kubernetes.io~csi/<pv>
//	<kubelet>/plugins/kubernetes.io/csi/berth.io/<x>/globalmount
//	<kubelet>/plugins/kubernetes.io/csi/volumeDevices/staging/<spec>
//	<kubelet>/plugins/kubernetes.io/csi/volumeDevices/publish/<spec>/<pod uid>
//	<staging root>/<volume>
//
// never a path below one of them: that is a volume's content, which its
// pods write, and a symlink made there after the check could redirect an
// unmount or a removal (F6). Nor another plugin's folder (a Secret's, an
// emptyDir's): a forged entry must not unmount those.
func (r Rule) CheckRecorded(p string) error {
	if err := r.check(p, false); err != nil {
		return err
	}
	if !r.exact(p) {
		return fmt.Errorf("%q is below a volume folder, not one kubelet or berth makes: %w", p, ErrRefused)
	}
	return nil
}

// exact says whether p (accepted by check) has one of the exact shapes
// CheckRecorded lists.
func (r Rule) exact(p string) bool {
	if rel, ok := below(r.staging, p); ok {
		return len(rel) == 1
	}
	rel, ok := below(r.kubelet, p)
	if !ok {
		return false
	}
	if rel[0] == "pods" {
		switch {
		case len(rel) == 6 && rel[2] == "volumes" && rel[3] == csiPlugin && rel[5] == "mount":
			return true
		case len(rel) == 5 && rel[2] == "volumes" && rel[3] == flexPlugin:
			return true
		case len(rel) == 5 && rel[2] == "volumeDevices" && rel[3] == csiPlugin:
			return true
		}
		return false
	}
	switch rel[3] {
	case DriverName:
		return len(rel) == 6 && rel[5] == "globalmount"
	case "volumeDevices":
		return (len(rel) == 6 && rel[4] == "staging") || (len(rel) == 7 && rel[4] == "publish")
	}
	return false
}

func (r Rule) check(p string, stats bool) error {
	if p == "" || !filepath.IsAbs(p) || filepath.Clean(p) != p || strings.ContainsRune(p, 0) {
		return fmt.Errorf("%q is not a clean absolute path (no .., //, trailing /): %w", p, ErrRefused)
	}
	base, ok := r.area(p, stats)
	if !ok {
		return fmt.Errorf("%q is outside kubelet's volume folders and berth's staging root: %w", p, ErrRefused)
	}
	return noSymlinks(base, p)
}

// area returns the root p lies under when its shape is an accepted one
// (with stats, a block volume's usage path too).
func (r Rule) area(p string, stats bool) (string, bool) {
	if rel, ok := below(r.staging, p); ok && len(rel) >= 1 {
		return r.staging, true
	}
	rel, ok := below(r.kubelet, p)
	if !ok {
		return "", false
	}
	csi := len(rel) >= 4 && rel[0] == "plugins" && rel[1] == "kubernetes.io" && rel[2] == "csi"
	switch {
	case len(rel) >= 5 && rel[0] == "pods" && (rel[2] == "volumes" || rel[2] == "volumeDevices"):
		return r.kubelet, true
	case csi && len(rel) >= 5 && rel[3] == DriverName:
		return r.kubelet, true
	case csi && len(rel) >= 6 && rel[3] == "volumeDevices" && (rel[4] == "staging" || rel[4] == "publish"):
		return r.kubelet, true
	case stats && csi && len(rel) == 7 && rel[3] == "volumeDevices" && rel[5] == "dev":
		return r.kubelet, true
	}
	return "", false
}

// below splits p's components under root; ok is false when p is not
// strictly inside root (or root is unset).
func below(root, p string) ([]string, bool) {
	if root == "" || !strings.HasPrefix(p, root+"/") {
		return nil, false
	}
	return strings.Split(p[len(root)+1:], "/"), true
}

// noSymlinks walks p's components under base with lstat, never following
// a link. A component that does not exist ends the walk: nothing below it
// exists either (the caller makes what is missing as plain folders).
func noSymlinks(base, p string) error {
	cur := base
	for _, c := range strings.Split(p[len(base)+1:], "/") {
		cur += "/" + c
		fi, err := os.Lstat(cur)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("check %s: %w", cur, err)
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			return fmt.Errorf("%q goes through the symlink %s: %w", p, cur, ErrRefused)
		}
	}
	return nil
}

// PodVolume is what a Flexvolume mount dir says: the pod's UID and the name
// kubelet mounts the volume by (pod volume name or PV name).
type PodVolume struct {
	PodUID string
	Name   string
}

// FlexMountDir checks p like Check and that it is exactly kubelet's mount
// dir of a Flexvolume volume, <kubelet>/pods/<uid>/volumes/<plugin>/<name>,
// where plugin is the driver's folder name (vendor~driver).
func (r Rule) FlexMountDir(p, plugin string) (PodVolume, error) {
	if err := r.Check(p); err != nil {
		return PodVolume{}, err
	}
	rel, ok := below(r.kubelet, p)
	if !ok || len(rel) != 5 || rel[0] != "pods" || rel[2] != "volumes" || rel[3] != plugin {
		return PodVolume{}, fmt.Errorf("%q is not kubelet's mount dir of a %s volume (%s/pods/<uid>/volumes/%s/<name>): %w",
			p, plugin, r.kubelet, plugin, ErrRefused)
	}
	return PodVolume{PodUID: rel[1], Name: rel[4]}, nil
}
