//go:build ceph

package userspace

import (
	"fmt"
	"os"
	"testing"
)

// TestIdleCephServerMemory is `make bench`'s memory row for ceph userspace
// volumes (hack/bench-ceph.sh), not a test: BENCH_MEMORY_VOLUMES (default
// 10) volumes on the test Ceph staged and published, idle; it asserts
// nothing about the figures. Runs only with BERTH_MEMORY_BENCH=1.
func TestIdleCephServerMemory(t *testing.T) {
	if os.Getenv("BERTH_MEMORY_BENCH") != "1" {
		t.Skip("a benchmark: BERTH_MEMORY_BENCH=1 (hack/bench-ceph.sh) runs it")
	}
	f, c, nc := cephSetup(t)
	names := make([]string, envInt("BENCH_MEMORY_VOLUMES", 10))
	for i := range names {
		names[i] = fmt.Sprintf("ceph-memory-%d", i)
		f.cephMounted(t, nc, c, names[i], 64)
	}
	f.reportIdleServers(t, "ceph", names)
}
