// Package volid is the one rule for a volume or snapshot ID, applied by CSI,
// the agent, the backends and the keeper alike.
package volid

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/berth-io/berth/internal/volerr"
)

// The rule is a DNS-1123 subdomain of at most 128 characters: every ID is
// also a Volume/Attachment object name, an image file name under the data
// dir (no '/', no NUL, no "..": a dot must sit between two alphanumerics) and
// an RBD image name. 128 is the local backend's long-standing limit; the IDs
// the CSI controller makes ("pvc-<uid>", "vol-<40 hex>") are far shorter.
// The CRD markers on NodeCleanup entries repeat these literals (markers
// cannot name Go constants); api/v1alpha1's CRD test holds them equal.
const (
	MaxLength = 128
	Pattern   = `^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
)

var pattern = regexp.MustCompile(Pattern)

// Valid returns nil for a valid ID, else an error wrapping volerr.ErrInvalid.
func Valid(id string) error {
	if len(id) == 0 || len(id) > MaxLength || !pattern.MatchString(id) {
		return fmt.Errorf("volume ID %q: want 1-%d lowercase letters, digits, '-' and '.' (a DNS-1123 subdomain): %w",
			id, MaxLength, volerr.ErrInvalid)
	}
	return nil
}

// shareDeviceSuffix ends the CSI volume handle of a share manager's
// PersistentVolume. '@' is in no ID, so no volume's own handle ends so.
const shareDeviceSuffix = "@share"

// ShareDevice is the CSI volume handle through which the share manager of
// a read-write-many filesystem volume reaches its device (a raw block
// PersistentVolume of the same image). It is not the volume's own handle
// because kubelet keys a node's volume state by driver and handle: a
// workload's filesystem stage and the share manager's block stage of one
// handle on one node would be one volume to kubelet, and it would skip the
// second stage or tear it down as the first one.
func ShareDevice(volume string) string { return volume + shareDeviceSuffix }

// ParseHandle returns the volume ID a CSI volume handle names, and whether
// the handle is the volume's ShareDevice handle. Any other handle is the
// volume ID itself (Valid tells whether it is one).
func ParseHandle(handle string) (volume string, shareDevice bool) {
	if v, ok := strings.CutSuffix(handle, shareDeviceSuffix); ok && v != "" {
		return v, true
	}
	return handle, false
}
