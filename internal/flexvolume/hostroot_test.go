package flexvolume

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestInRootResolvesLinksBelowRoot: an absolute link on the node (a /usr
// moved to /opt, say) leads to the node's folder, never to this process's
// own; ".." cannot climb out of the root.
func TestInRootResolvesLinksBelowRoot(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "opt", "usr"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/opt/usr", filepath.Join(root, "usr")); err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		"/usr/libexec/exec": filepath.Join(root, "opt", "usr", "libexec", "exec"),
		"/../../etc":        filepath.Join(root, "etc"),
		"/var/plugins":      filepath.Join(root, "var", "plugins"),
	} {
		got, err := InRoot(root, in)
		if err != nil || got != want {
			t.Errorf("InRoot(%s): %q, %v; want %q", in, got, err, want)
		}
	}
	if got, err := InRoot("/", "/usr/x/../y"); err != nil || got != "/usr/y" {
		t.Errorf("InRoot(/): %q, %v", got, err)
	}
}

// hostRootHelper, when set, makes the test binary print HostRoot and exit:
// the tests below run it in namespaces of their own.
const hostRootHelper = "BERTH_TEST_HOSTROOT_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(hostRootHelper) != "" {
		root, err := HostRoot("/proc")
		if err != nil {
			fmt.Println("error", err)
		} else {
			fmt.Println("root", root)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runHelper runs this test binary under unshare with args.
func runHelper(t *testing.T, args ...string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("namespaces need root")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("no unshare (util-linux)")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(unshare, append(args, self)...)
	cmd.Env = append(os.Environ(), hostRootHelper+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", cmd.Args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestHostRootOfAContainer: a process in a mount namespace of its own (as
// an agent container is) finds the node's root through its parent (the
// runtime's shim), which is in the node's namespace.
func TestHostRootOfAContainer(t *testing.T) {
	got := runHelper(t, "--mount", "--propagation", "private")
	if want := fmt.Sprintf("root /proc/%d/root", os.Getpid()); got != want {
		t.Errorf("HostRoot in a new mount namespace: %q, want %q", got, want)
	}
}

// TestHostRootRefusedWithoutHostPID: in a PID namespace of its own (an
// agent pod without hostPID) no ancestor is visible; HostRoot refuses
// rather than take the container's root for the node's.
func TestHostRootRefusedWithoutHostPID(t *testing.T) {
	got := runHelper(t, "--mount", "--propagation", "private", "--pid", "--fork")
	if !strings.HasPrefix(got, "error ") || !strings.Contains(got, "hostPID") {
		t.Errorf("HostRoot in a new PID namespace: %q, want an error naming hostPID", got)
	}
}

// TestHostRootOfThisProcess: run on the host (the test's ancestors share
// its mount namespace up to one it may not inspect, as a sandbox's init),
// HostRoot is "/" and no error.
func TestHostRootOfThisProcess(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("reading other processes' namespaces needs root")
	}
	got, err := HostRoot("/proc")
	if err != nil {
		t.Fatalf("HostRoot: %v", err)
	}
	if got != "/" {
		t.Logf("an ancestor of the test is in another mount namespace: %s", got)
	}
}
