//go:build tools

// Package tools pins modules that berth's tests and tools build from source
// (csi-sanity), so that go.mod records their versions.
package tools

import (
	_ "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity"
)
