//go:build !ceph

package version

// ceph: this binary was built without the ceph backend (`make build CEPH=0`).
const ceph = false
