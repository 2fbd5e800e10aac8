//go:build !ceph

package rbdimage

import (
	"errors"
	"testing"
)

func TestOpenWithoutTheTag(t *testing.T) {
	if _, err := Open("/run/x.json"); !errors.Is(err, ErrNotBuilt) || err.Error() != "RBD image of /run/x.json: berth built without the ceph backend (build tag ceph): it cannot serve RBD images" {
		t.Fatalf("Open = %v", err)
	}
}
