package csi

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// objectName turns a name Kubernetes (or csi-sanity) asked for into an API
// object name. Kubernetes' own names ("pvc-<uid>", "snapshot-<uid>") are
// used as they are, so `kubectl get volumes` shows the PV name; any other
// name maps to a stable hash, so that a retried call finds the same object.
func objectName(prefix, csiName string) string {
	if len(csiName) <= 128 && len(validation.IsDNS1123Label(csiName)) == 0 {
		return csiName
	}
	sum := sha256.Sum256([]byte(csiName))
	return prefix + "-" + hex.EncodeToString(sum[:])[:40]
}

// validID reports whether id can name a berth object (volume or snapshot ID).
func validID(id string) bool {
	return id != "" && len(id) <= 128 && !strings.ContainsAny(id, "/\x00") && len(validation.IsDNS1123Label(id)) == 0
}
