package sharemanager_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-io/berth/internal/testenv"
)

// TestRootNeverFormatKeepsABlankLookingDevice (F11): a share manager
// told never to format (the operator's --never-format for a Volume that
// recorded a filesystem, a clone or a restore) refuses a device on which
// blkid finds nothing, exits non-zero and makes no filesystem; without
// the flag the same device is formatted and served.
func TestRootNeverFormatKeepsABlankLookingDevice(t *testing.T) {
	e := newShareEnv(t)
	args := []string{e.bin, "share-manager",
		"--volume", e.volume, "--device", e.dev, "--mount-path", e.mountPath(), "--state-dir", e.stateDir(),
		"--bind-address", "127.0.0.1", "--port", "1", "--never-format=it is a clone of volume pvc-src"}
	p, err := testenv.StartProcess(filepath.Join(e.dir, "share-manager.log"), args...)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop(syscall.SIGKILL, time.Second)
	for deadline := time.Now().Add(30 * time.Second); !p.Exited(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("share manager told never to format still runs on a blank device; log:\n%s", e.log())
		}
	}
	if code := p.ExitCode(); code == 0 {
		t.Errorf("share manager exited 0; log:\n%s", e.log())
	}
	if log := e.log(); !strings.Contains(log, "it is a clone of volume pvc-src") {
		t.Errorf("log does not say why it refused:\n%s", log)
	}
	if out, err := exec.Command("blkid", "-p", e.dev).CombinedOutput(); err == nil {
		t.Fatalf("a filesystem was made on the device: %s", out)
	}

	e.start(t) // allowed: formats and serves
	if out, err := exec.Command("blkid", "-p", "-s", "TYPE", "-o", "value", e.dev).CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "ext4" {
		t.Errorf("device after a share manager allowed to format: %v %s", err, out)
	}
}
