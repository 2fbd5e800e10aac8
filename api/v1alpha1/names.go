package v1alpha1

import (
	"errors"
	"fmt"
	"regexp"
)

// The one rule for a volume's name wherever the agent takes one (CSI volume
// ID, Flexvolume option, Attachment and NodeCleanup entries): a valid Volume
// object name (DNS-1123 subdomain) that the local backend also accepts as an
// image ID, so at most 128 characters. The CRD markers on NodeCleanup
// entries repeat these literals (markers cannot name Go constants).
const (
	VolumeNameMaxLength = 128
	VolumeNamePattern   = `^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
)

// ErrInvalidVolumeName marks a name that breaks the volume name rule.
var ErrInvalidVolumeName = errors.New("invalid volume name")

var volumeName = regexp.MustCompile(VolumeNamePattern)

// ValidateVolumeName applies the volume name rule.
func ValidateVolumeName(name string) error {
	if len(name) == 0 || len(name) > VolumeNameMaxLength || !volumeName.MatchString(name) {
		return fmt.Errorf("volume name %q: want 1-%d lowercase letters, digits, '-' and '.' (a DNS-1123 subdomain): %w",
			name, VolumeNameMaxLength, ErrInvalidVolumeName)
	}
	return nil
}
