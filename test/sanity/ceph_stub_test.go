//go:build !ceph

package sanity

import (
	"fmt"
	"testing"
)

// cephSanity: a test binary without the ceph backend (build tag ceph) has
// no ceph class to test; its specs are skipped, and the reason printed.
func cephSanity(*testing.T, func(params map[string]string, secretsFile string)) []string {
	fmt.Println("sanity: the ceph class's specs are skipped: built without the ceph backend (go test -tags ceph,pacific)")
	return []string{cephSpecs}
}
