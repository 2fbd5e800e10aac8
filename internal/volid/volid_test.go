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

// The share manager's handle of a volume is never a volume's own handle
// (kubelet would take the two for one volume on a node) and names the
// volume it was made from.
func TestShareDeviceHandle(t *testing.T) {
	for _, id := range []string{"pvc-0b5e7c2a-1111-2222-3333-444455556666", "vol-" + strings.Repeat("0123456789", 4), "a.b-c", "v"} {
		h := ShareDevice(id)
		if h == id || Valid(h) == nil {
			t.Errorf("ShareDevice(%q) = %q: a volume ID, so it may be another volume's handle", id, h)
		}
		if v, share := ParseHandle(h); v != id || !share {
			t.Errorf("ParseHandle(%q) = %q, %v; want %q, true", h, v, share, id)
		}
		if v, share := ParseHandle(id); v != id || share {
			t.Errorf("ParseHandle(%q) = %q, %v; want the ID itself, false", id, v, share)
		}
	}
	for _, h := range []string{"", "@share", "x@shares", "x@share.img"} {
		if v, share := ParseHandle(h); v != h || share {
			t.Errorf("ParseHandle(%q) = %q, %v; want it unchanged, false", h, v, share)
		}
	}
}
