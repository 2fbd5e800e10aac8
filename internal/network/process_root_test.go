package network

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
)

const moverEnvDir = "BERTH_TEST_MOVER_DIR"

// TestMoverProcess is the mover process of the root tests: what `berth
// mover` runs, in the namespace it was started in.
func TestMoverProcess(t *testing.T) {
	ctx, dir, host := childProcess(t, moverEnvDir, "the mover process")
	m := NewMover(host, ProcNamespaces{Proc: "/proc", AnyPod: true}, dir, testr.New(t))
	m.Interval = 20 * time.Millisecond
	if err := m.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// startMover starts a mover process in the test host namespace and
// returns once it handles SIGTERM (a child starved of CPU may take longer
// than any fixed wait to get there).
func (l *lab) startMover(t *testing.T) *exec.Cmd {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "ready")
	cmd := exec.Command(os.Args[0], "-test.run=^TestMoverProcess$")
	cmd.Env = append(os.Environ(), moverEnvDir+"="+string(l.dir), childReadyEnv+"="+ready)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	// The child is cloned from the thread that starts it, in its namespace.
	if err := NewInNamespace(ThreadSwitcher{}).Do(l.host, cmd.Start); err != nil {
		t.Fatalf("start mover process: %v", err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if t.Failed() {
			t.Logf("mover process output:\n%s", out.String())
		}
	})
	waitFor(t, "mover process handling SIGTERM", func() bool {
		_, err := os.Stat(ready)
		return err == nil
	})
	return cmd
}

// TestMoverProcessLife runs the mover as a process: killed, it leaves its
// copy; a new one adopts the copy of the live holder, and SIGTERM removes
// it and gives the holder its interface back.
func TestMoverProcessLife(t *testing.T) {
	l := newLab(t)
	h := l.startHolder(t, "pod-a", "10.77.0.10", macA)
	copied := func() bool {
		c, err := l.hostNL.LinkByName(CopyName(h.uid))
		return err == nil && c.Attrs().Alias == copyAlias(stateCopied, Record{PodUID: h.uid, Interface: holderIfc})
	}
	first := l.startMover(t)
	waitFor(t, "copy by the first mover", copied)
	before := l.checkCopy(t, h, true)
	_ = first.Process.Signal(syscall.SIGKILL)
	_ = first.Wait()
	if !copied() {
		t.Fatal("a killed mover took its copy with it")
	}
	second := l.startMover(t)
	time.Sleep(200 * time.Millisecond) // rounds of the second mover
	if after := l.checkCopy(t, h, true); after.Attrs().Index != before.Attrs().Index {
		t.Errorf("the second mover made the copy again; want it adopted")
	}
	if ip, err := l.dialPeer(l.host); err != nil || ip != h.ip {
		t.Errorf("dial peer over the adopted copy: local %s, %v", ip, err)
	}
	if err := second.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := second.Wait(); err != nil {
		t.Fatalf("mover after SIGTERM: %v", err)
	}
	l.noCopy(t, h.uid)
	l.checkOriginal(t, h)
}
