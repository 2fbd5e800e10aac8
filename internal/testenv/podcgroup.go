package testenv

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// PodCgroup moves pid into a cgroup named as kubelet names pod uid's
// (".../kubepods.../pod<uid>"), on this machine's cgroup hierarchy (v2, or
// v1's cpu controller), and removes it at the end.
func PodCgroup(t *testing.T, pid int, uid string) {
	t.Helper()
	root := "/sys/fs/cgroup"
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err != nil {
		root = filepath.Join(root, "cpu")
	}
	parent := filepath.Join(root, "berth-test-kubepods-"+strconv.Itoa(os.Getpid()))
	dir := filepath.Join(parent, "pod"+uid)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Skipf("cannot make a cgroup under %s: %v", root, err)
	}
	t.Cleanup(func() {
		// A process still there (its test kills it later) goes back to
		// the root group, so that the folder can go.
		if b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err == nil {
			for _, p := range strings.Fields(string(b)) {
				_ = os.WriteFile(filepath.Join(root, "cgroup.procs"), []byte(p), 0o644)
			}
		}
		_ = os.Remove(dir)
		_ = os.Remove(parent)
	})
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		t.Fatalf("move %d into %s: %v", pid, dir, err)
	}
}
