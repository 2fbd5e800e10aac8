//go:build !ceph

package userspace

import "github.com/berth-io/berth/internal/testenv"

// buildBerth builds the berth the agent and its servers run.
func buildBerth(dir string) (string, error) { return testenv.BuildBerth(dir) }
