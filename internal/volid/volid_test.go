package volid

import (
	"errors"
	"strings"
	"testing"

	"github.com/berth-io/berth/internal/volerr"
)

func TestValid(t *testing.T) {
	valid := []string{
		// What the CSI controller makes: Kubernetes' names as they are,
		// anything else hashed (see internal/csi/names.go).
		"pvc-0b5e7c2a-1111-2222-3333-444455556666",
		"snapshot-0b5e7c2a-1111-2222-3333-444455556666",
		"vol-" + strings.Repeat("0123456789", 4),
		"snap-" + strings.Repeat("abcdef0123", 4),
		"v", "9", "a.b-c", strings.Repeat("a", 63), strings.Repeat("a", 128),
	}
	invalid := []string{
		"", strings.Repeat("a", 129), "a/b", "a\x00b", "..", "a..b", ".hidden", "x.", "-x", "x-",
		"a b", "PVC-1", "a_b", "ümlaut",
	}
	for _, id := range valid {
		if err := Valid(id); err != nil {
			t.Errorf("Valid(%q) = %v, want nil", id, err)
		}
	}
	for _, id := range invalid {
		if err := Valid(id); !errors.Is(err, volerr.ErrInvalid) {
			t.Errorf("Valid(%q) = %v, want ErrInvalid", id, err)
		}
	}
}
