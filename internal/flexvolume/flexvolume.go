// Package flexvolume speaks kubelet's Flexvolume driver protocol: kubelet
// executes the driver with a command and arguments and reads one JSON object
// from its stdout. berth's driver is thin: it parses what kubelet passes and
// forwards the work to the node agent over its socket.
package flexvolume

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"unicode/utf8"

	"github.com/berth-io/berth/internal/volerr"
)

// Driver is the Flexvolume driver name: kubelet runs it from
// <volume-plugin-dir>/berth.io~berth/berth.
const (
	Vendor = "berth.io"
	Name   = "berth"
	// Dir is the driver's folder under the volume plugin dir.
	Dir = Vendor + "~" + Name
)

// Status values of a driver result.
const (
	StatusSuccess      = "Success"
	StatusFailure      = "Failure"
	StatusNotSupported = "Not supported"
)

// Result is what the driver prints.
type Result struct {
	Status       string        `json:"status"`
	Message      string        `json:"message,omitempty"`
	Capabilities *Capabilities `json:"capabilities,omitempty"`
}

// Capabilities are announced by init.
type Capabilities struct {
	Attach bool `json:"attach"`
}

// Options kubelet passes to mount, with keys documented for Flexvolume.
const (
	OptFSType       = "kubernetes.io/fsType"
	OptReadWrite    = "kubernetes.io/readwrite"
	OptPodName      = "kubernetes.io/pod.name"
	OptPodNamespace = "kubernetes.io/pod.namespace"
	OptPodUID       = "kubernetes.io/pod.uid"
	OptVolumeName   = "kubernetes.io/pvOrVolumeName"
	// OptServiceAccount is the pod's service account.
	OptServiceAccount = "kubernetes.io/serviceAccount.name"
	// OptVolume is berth's own option: the Volume to mount when it differs
	// from the PV or pod volume name.
	OptVolume = "volume"
)

// MountRequest is a parsed `mount <mount dir> <json options>`.
type MountRequest struct {
	MountDir string
	Volume   string
	// PVOrVolumeName is what kubelet names the mount by: the PV's name, or
	// the pod's volume name for an inline flexVolume.
	PVOrVolumeName string
	FSType         string
	ReadOnly       bool
	PodNamespace   string
	PodName        string
	PodUID         string
	ServiceAccount string
}

// ErrUsage marks malformed driver arguments.
var ErrUsage = volerr.New(volerr.ErrInvalid, "flexvolume usage")

// ParseMount parses the arguments of the mount call.
func ParseMount(args []string) (MountRequest, error) {
	if len(args) != 2 {
		return MountRequest{}, fmt.Errorf("mount wants <mount dir> <json options>, got %d arguments: %w", len(args), ErrUsage)
	}
	dir := args[0]
	// Not cleaned: the agent refuses a mount dir that is not clean rather
	// than guess what kubelet meant.
	if !filepath.IsAbs(dir) || !utf8.ValidString(dir) {
		// Not UTF-8: the JSON to the agent would name another path.
		return MountRequest{}, fmt.Errorf("mount dir %q is not an absolute UTF-8 path: %w", dir, ErrUsage)
	}
	var opts map[string]string
	if err := json.Unmarshal([]byte(args[1]), &opts); err != nil {
		return MountRequest{}, fmt.Errorf("options are not a JSON object of strings: %w: %w", err, ErrUsage)
	}
	r := MountRequest{
		MountDir: dir, FSType: opts[OptFSType],
		PodNamespace: opts[OptPodNamespace], PodName: opts[OptPodName], PodUID: opts[OptPodUID],
		ServiceAccount: opts[OptServiceAccount],
		Volume:         opts[OptVolume], PVOrVolumeName: opts[OptVolumeName],
	}
	if r.Volume == "" {
		r.Volume = opts[OptVolumeName]
	}
	if r.Volume == "" {
		return MountRequest{}, fmt.Errorf("no volume named: set option %q or use a PersistentVolume: %w", OptVolume, ErrUsage)
	}
	switch rw := opts[OptReadWrite]; rw {
	case "", "rw":
	case "ro":
		r.ReadOnly = true
	default:
		return MountRequest{}, fmt.Errorf("option %s=%q: want rw or ro: %w", OptReadWrite, rw, ErrUsage)
	}
	return r, nil
}
