package csi

import (
	"crypto/sha256"
	"encoding/hex"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/berth-io/berth/internal/volid"
)

// objectName turns a name Kubernetes (or csi-sanity) asked for into an API
// object name. Kubernetes' own names ("pvc-<uid>", "snapshot-<uid>") are
// used as they are, so `kubectl get volumes` shows the PV name; any other
// name maps to a stable hash, so that a retried call finds the same object.
// Only DNS-1123 labels are kept (a subset of valid IDs): widening this would
// give a name that is hashed today another ID after an upgrade.
func objectName(prefix, csiName string) string {
	if len(validation.IsDNS1123Label(csiName)) == 0 {
		return csiName
	}
	sum := sha256.Sum256([]byte(csiName))
	return prefix + "-" + hex.EncodeToString(sum[:])[:40]
}

// validID reports whether id can name a berth object (volume or snapshot
// ID): the one rule of internal/volid. A request with any other ID names
// nothing berth made, so callers answer NotFound.
func validID(id string) bool {
	return volid.Valid(id) == nil
}
