//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// vmSanityTransports are the userspace transports csi-sanity runs over on
// the VM node: those this machine's kernel lacks (FUSE runs in make test).
var vmSanityTransports = []string{"nbd", "ublk"}

// testVMSanity: csi-sanity (mount and block access, a local class of
// userspace volumes) against berth's agent and CSI controller on a VM
// node's stock kernel, once per transport in vmSanityTransports: 0
// failed, nothing left behind. test/sanity runs there as a static test
// binary (without the ceph backend: the ceph class is not in it) with its
// own kube-apiserver and etcd from the cluster's kube binaries share; the
// cluster's own agents are not involved.
func testVMSanity(t *testing.T) {
	if os.Getenv("BERTH_E2E_VM_SANITY") == "0" {
		t.Skip("BERTH_E2E_VM_SANITY=0: csi-sanity on the VM node is left out")
	}
	env, _ := needCluster(t)
	vm := env.vmNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Minute)
	defer cancel()

	// The cmd share of the node (hack/vm/vm.sh) carries the files in.
	nodeDir := ""
	for i := 1; env.Vars[fmt.Sprintf("NODE_NAME_%d", i)] != ""; i++ {
		if env.Vars[fmt.Sprintf("NODE_NAME_%d", i)] == vm {
			nodeDir = env.Vars[fmt.Sprintf("NODE_DIR_%d", i)]
		}
	}
	if nodeDir == "" {
		t.Fatalf("no NODE_DIR for %s in cluster.env", vm)
	}
	name := fmt.Sprintf("sanity-%d", os.Getpid())
	share := filepath.Join(nodeDir, "vm", "cmd", name)
	t.Cleanup(func() { _ = os.RemoveAll(share) })
	buildVMSanity(ctx, t, share)

	guest := "/var/tmp/berth-" + name
	vmRun := func(script string, timeout time.Duration) (string, error) {
		c, cancel := context.WithTimeout(ctx, timeout+time.Minute)
		defer cancel()
		return env.vmExecFor(c, vm, script, timeout)
	}
	// Onto the node's disk: binaries run from 9p page in at ~10 MB/s.
	if out, err := vmRun(fmt.Sprintf(`set -e
mkdir -p %[1]s/kube
cp -r /run/berth-vm/cmd/%[2]s/. %[1]s/
cp /mnt/berth-kube/etcd /mnt/berth-kube/kube-apiserver %[1]s/kube/`, guest, name), 5*time.Minute); err != nil {
		t.Fatalf("copy the sanity binaries into %s: %v\n%s", vm, err, out)
	}
	t.Cleanup(func() {
		// Cleanups run after ctx is cancelled: a context of its own.
		c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if out, err := env.vmExecFor(c, vm, "rm -rf "+guest, time.Minute); err != nil {
			t.Errorf("remove %s on %s: %v\n%s", guest, vm, err, out)
		}
	})

	counts := regexp.MustCompile(`(?m)^sanity: (\d+) passed, (\d+) failed, (\d+) skipped$`)
	for _, tr := range vmSanityTransports {
		start := time.Now()
		// KUBEBUILDER_CONTROLPLANE_START_TIMEOUT: kube-apiserver starts
		// slowly under TCG; envtest's default is 20 s.
		out, err := vmRun(fmt.Sprintf(`cd %[1]s && KUBEBUILDER_CONTROLPLANE_START_TIMEOUT=300s KUBEBUILDER_ASSETS=%[1]s/kube \
BERTH_TEST_REPO_ROOT=%[1]s/repo BERTH_TEST_BIN_DIR=%[1]s BERTH_SANITY_TRANSPORT=%[2]s BERTH_CEPH=0 TMPDIR=/var/tmp \
%[1]s/sanity.test -test.run 'TestSanity$' -test.timeout 30m >%[1]s/sanity-%[2]s.log 2>&1
rc=$?
grep -E '^sanity: |^--- |^(ok|FAIL|PASS)' %[1]s/sanity-%[2]s.log
[ $rc -eq 0 ] || sed 's/\x1b\[[0-9;]*m//g' %[1]s/sanity-%[2]s.log | grep -E -A12 '\[FAIL\]|^testenv:|panic:' | head -150
exit $rc`, guest, tr), 35*time.Minute)
		took := time.Since(start).Round(time.Second)
		m := counts.FindStringSubmatch(out)
		if err != nil || m == nil {
			t.Errorf("csi-sanity over %s on %s (%s): %v\n%s", tr, vm, took, err, out)
			continue
		}
		passed, _ := strconv.Atoi(m[1])
		failed, _ := strconv.Atoi(m[2])
		if failed > 0 || passed == 0 || !strings.Contains(out, "sanity: nothing left behind") {
			t.Errorf("csi-sanity over %s on %s: %s passed, %s failed (want > 0 and 0, and nothing left behind)\n%s", tr, vm, m[1], m[2], out)
			continue
		}
		t.Logf("csi-sanity over %s on %s: %s passed, %s failed, %s skipped in %s\n%s", tr, vm, m[1], m[2], m[3], took, out)
		fmt.Printf("VM_SANITY_RESULT transport=%s passed=%s failed=%s skipped=%s took=%s\n", tr, m[1], m[2], m[3], took)
	}
}

// buildVMSanity builds, into dir, what test/sanity needs on a node without
// Go: its test binary and berth (with berth-blockdev) static, without the
// ceph backend (the node's userland is not the build machine's), and the
// CRDs the test's API server installs.
func buildVMSanity(ctx context.Context, t *testing.T, dir string) {
	t.Helper()
	root := repoRoot()
	if err := os.MkdirAll(filepath.Join(dir, "repo", "config", "crd"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"test", "-c", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(dir, "sanity.test"), "./test/sanity"},
		{"build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(dir, "berth"), "./cmd/berth"},
		{"build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(dir, "berth-blockdev"), "./cmd/berth-blockdev"},
	} {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	cmd := exec.CommandContext(ctx, "cp", "-r", filepath.Join(root, "config", "crd", "bases"), filepath.Join(dir, "repo", "config", "crd"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("copy the CRDs: %v\n%s", err, out)
	}
}
