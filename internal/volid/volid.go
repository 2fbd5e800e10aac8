// Package volid is the one rule for a volume or snapshot ID, applied by CSI,
// the agent, the backends and the keeper alike.
package volid

import (
	"fmt"
	"regexp"

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
