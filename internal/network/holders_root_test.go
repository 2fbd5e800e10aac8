package network

import (
	"errors"
	"os"
	"os/exec"
	"testing"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/berth-io/berth/internal/testenv"
)

// OpenHolder on real namespaces: a folder with a stale record (its
// namespace has no process left) and a live one opens the live holder's
// namespace; once that holder's process is gone too, ErrNoHolder.
func TestOpenHolder(t *testing.T) {
	// Namespaces the test holds by handle only: no process is in them.
	stale, live := testenv.NetNS(t), testenv.NetNS(t)
	dir := Dir(t.TempDir())
	procs := ProcNamespaces{Proc: "/proc", AnyPod: true}
	if _, _, err := procs.OpenHolder(string(dir)); !errors.Is(err, ErrNoHolder) {
		t.Fatalf("empty folder: %v, want ErrNoHolder", err)
	}
	if err := dir.Write(Record{PodUID: "a-stale", Interface: "net1", PID: os.Getpid(), NetNS: nsid(t, stale)}); err != nil {
		t.Fatal(err)
	}
	holder := exec.Command("sleep", "60")
	if err := NewInNamespace(ThreadSwitcher{}).Do(live, holder.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	// The PID as a holder in its own PID namespace would record it: a
	// hint that points nowhere useful here.
	if err := dir.Write(Record{PodUID: "b-live", Interface: "net1", PID: 1, NetNS: nsid(t, live)}); err != nil {
		t.Fatal(err)
	}
	ns, rec, err := procs.OpenHolder(string(dir))
	if err != nil {
		t.Fatal(err)
	}
	if rec.PodUID != "b-live" || !ns.Equal(live) {
		t.Errorf("opened %s's namespace, want b-live's", rec.PodUID)
	}
	_ = ns.Close()

	_ = holder.Process.Kill()
	_ = holder.Wait()
	if _, _, err := procs.OpenHolder(string(dir)); !errors.Is(err, ErrNoHolder) || !errors.Is(err, ErrHolderGone) {
		t.Fatalf("holder process gone: %v, want ErrNoHolder and ErrHolderGone", err)
	}
}

func nsid(t *testing.T, ns netns.NsHandle) NSID {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(ns), &st); err != nil {
		t.Fatal(err)
	}
	return NSID{Dev: st.Dev, Ino: st.Ino}
}
