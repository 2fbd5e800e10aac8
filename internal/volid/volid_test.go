package volid

import (
	"errors"
	"strings"
	"testing"
)

func TestValid(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		// What the CSI controller makes: Kubernetes' names as they are,
		// anything else hashed (see internal/csi/names.go).
		{"pvc-0b5e7c2a-1111-2222-3333-444455556666", true},
		{"snapshot-0b5e7c2a-1111-2222-3333-444455556666", true},
		{"vol-" + strings.Repeat("0123456789", 4), true},
		{"snap-" + strings.Repeat("abcdef0123", 4), true},
		{"v", true},
		{"9", true},
		{"a.b-c", true},
		{strings.Repeat("a", 63), true},
		{strings.Repeat("a", 128), true},
		{strings.Repeat("a", 129), false},
		{"", false},
		{"a/b", false},
		{"a\x00b", false},
		{"..", false},
		{"a..b", false},
		{".hidden", false},
		{"x.", false},
		{"-x", false},
		{"x-", false},
		{"a b", false},
		{"PVC-1", false},
		{"a_b", false},
		{"ümlaut", false},
	} {
		err := Valid(tc.id)
		if tc.ok && err != nil {
			t.Errorf("Valid(%q) = %v, want nil", tc.id, err)
		}
		if !tc.ok && !errors.Is(err, ErrInvalid) {
			t.Errorf("Valid(%q) = %v, want ErrInvalid", tc.id, err)
		}
	}
}
