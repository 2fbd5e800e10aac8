package userspace

import "github.com/berth-io/berth/internal/testenv"

// buildBerth builds the berth the agent and its servers run, as `make
// build` does (with the ceph backend unless BERTH_CEPH=0).
func buildBerth(dir string) (string, error) { return testenv.BuildBerth(dir) }
