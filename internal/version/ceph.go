//go:build ceph

package version

// ceph: this binary has the ceph backend (go-ceph, cgo).
const ceph = true
