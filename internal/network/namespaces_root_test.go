package network

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-io/berth/internal/testenv"
)

// A record takes the namespace only of a process of its own pod (F19): a
// holder record naming the network namespace of another pod's process is
// refused, whether it names that process's PID or not.
func TestNamespaceOnlyOfTheRecordsPod(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces and cgroups")
	}
	const ours, theirs = "11111111-2222-3333-4444-555555555555", "66666666-7777-8888-9999-000000000000"
	other := testenv.NetNS(t)
	proc := exec.Command("sleep", "60")
	if err := NewInNamespace(ThreadSwitcher{}).Do(other, proc.Start); err != nil {
		t.Fatal(err)
	}
	testenv.PodCgroup(t, proc.Process.Pid, theirs)
	t.Cleanup(func() { _ = proc.Process.Kill(); _ = proc.Wait() })
	procs := ProcNamespaces{Proc: "/proc"}
	for _, pid := range []int{proc.Process.Pid, 0} {
		_, err := procs.find(Record{PodUID: ours, Interface: "net1", PID: pid, NetNS: nsid(t, other)})
		if err == nil || errors.Is(err, ErrHolderGone) || !strings.Contains(err.Error(), "not of pod") {
			t.Errorf("record of pod %s naming pod %s's namespace (pid %d): %v, want refused", ours, theirs, pid, err)
		}
	}
	path, err := procs.find(Record{PodUID: theirs, Interface: "net1", PID: proc.Process.Pid, NetNS: nsid(t, other)})
	if want := filepath.Join("/proc", strconv.Itoa(proc.Process.Pid), "ns", "net"); err != nil || path != want {
		t.Errorf("record of the namespace's own pod: %q, %v; want %s", path, err, want)
	}
}
