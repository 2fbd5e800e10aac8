package agent

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilexec "k8s.io/utils/exec"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"

	"github.com/berth-io/berth/internal/backend"
	"github.com/berth-io/berth/internal/mount"
)

// freezeHelperEnv names the helper's parameters (JSON of freezeHelper):
// set, TestFreezeHelperProcess is the agent that dies while frozen.
const freezeHelperEnv = "BERTH_TEST_FREEZE_HELPER"

type freezeHelper struct {
	DataDir, FreezeDir string
	RWX                bool
}

// TestFreezeHelperProcess is not a test: run by TestRootThawAtStartAfterAgentDied
// in a mount namespace of its own (as an agent's container), it freezes the
// volume through Agent.Quiesce, says so and waits to be killed.
func TestFreezeHelperProcess(t *testing.T) {
	var h freezeHelper
	if err := json.Unmarshal([]byte(os.Getenv(freezeHelperEnv)), &h); err != nil {
		t.Skip("a helper process of TestRootThawAtStartAfterAgentDied")
	}
	log := testr.NewWithInterface(t, testr.Options{})
	images, err := backend.NewLocal(h.DataDir, log)
	if err != nil {
		t.Fatal(err)
	}
	a := newTestAgent(t, Config{Images: images, Loop: mount.NewLoop(utilexec.New()),
		Mounts: mount.NewManager(mount.NewMounter(), utilexec.New(), log), Log: log,
		API: fakeAPI(t, rwxVolume(h.RWX)...).Build(), FreezeDir: h.FreezeDir, FreezeLimit: time.Hour})
	hold, err := a.Quiesce(t.Context(), "vol")
	if err != nil || !hold.Stable {
		t.Fatalf("quiesce: %v (stable %t)", err, hold.Stable)
	}
	fmt.Println("frozen")
	select {}
}

// TestRootThawAtStartAfterAgentDied (F7): an agent froze a volume's
// filesystem for a copy and was killed before the thaw, its container's
// mount namespace gone with it. The filesystem stays frozen (a writer
// blocks) until the next agent's start path (ThawLeftovers) runs: then the
// writer goes through and the freeze record is gone. A staged ext4 and
// xfs, and an RWX volume's ext4 mounted only in its share manager's
// namespace (frozen through the dead agent's own scratch mount).
func TestRootThawAtStartAfterAgentDied(t *testing.T) {
	for _, c := range []struct {
		name, fsType string
		rwx          bool
	}{{"staged ext4", "ext4", false}, {"staged xfs", "xfs", false}, {"shared ext4", "ext4", true}} {
		rwx := c.rwx
		t.Run(c.name, func(t *testing.T) {
			var e *quiesceEnv
			var dir string
			if rwx {
				e = newRWXQuiesceEnv(t)
				e.stage(t, true)
				if out, err := exec.Command("mkfs.ext4", "-q", e.dev).CombinedOutput(); err != nil {
					t.Fatalf("mkfs: %v: %s", err, out)
				}
				_, dir = shareManagerMount(t, e.dev)
			} else {
				e = newQuiesceEnvSized(t, 320<<20)
				dir = e.stageFS(t, false, c.fsType)
			}
			freezeDir := t.TempDir()
			thawOnFailure(t, dir)
			killFrozenAgent(t, freezeHelper{DataDir: filepath.Clean(strings.TrimSuffix(mustImage(t, e.images, "vol"), backend.VolumeFile("vol"))), FreezeDir: freezeDir, RWX: rwx})

			written := writeAsync(dir)
			select {
			case err := <-written:
				t.Fatalf("the filesystem took a write after the agent died frozen (%v): nothing to thaw", err)
			case <-time.After(300 * time.Millisecond):
			}
			log := testr.NewWithInterface(t, testr.Options{})
			a := newTestAgent(t, Config{Images: e.images, Loop: e.loop, Mounts: e.mounts, Log: log,
				API: fakeAPI(t, rwxVolume(rwx)...).Build(), FreezeDir: freezeDir})
			n, err := a.ThawLeftovers(t.Context())
			if err != nil || n != 1 {
				t.Errorf("thaw at start: %d thawed, %v; want 1", n, err)
			}
			select {
			case err := <-written:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("a write still waits after the start's thaw")
			}
			if left, _ := filepath.Glob(filepath.Join(freezeDir, "*", "*")); len(left) != 0 {
				t.Errorf("left behind: %v", left)
			}
			if n, err := a.ThawLeftovers(t.Context()); err != nil || n != 0 {
				t.Errorf("second start: %d thawed, %v; want none", n, err)
			}
		})
	}
}

// TestRootFreezeEndsAtItsLimit (F7): a copy that hangs past the freeze
// limit (its Release never comes) does not keep the writers waiting: the
// filesystem thaws at the limit, the hold's context has ended, and the
// freeze record is gone; the late Release thaws nothing twice. The limit
// (3 s) is far from the 200 ms in which a write must still wait, so that a
// loaded machine's late timer cannot see the thaw as a write that went
// through.
func TestRootFreezeEndsAtItsLimit(t *testing.T) {
	e := newQuiesceEnv(t)
	dir := e.stage(t, false)
	thawOnFailure(t, dir)
	freezeDir := t.TempDir()
	log := testr.NewWithInterface(t, testr.Options{})
	a := newTestAgent(t, Config{Images: e.images, Loop: e.loop, Mounts: e.mounts, Log: log,
		API: fakeAPI(t).Build(), FreezeDir: freezeDir, FreezeLimit: 3 * time.Second})
	hold, err := a.Quiesce(t.Context(), "vol")
	if err != nil || !hold.Stable {
		t.Fatalf("quiesce: %v (stable %t)", err, hold.Stable)
	}
	written := writeAsync(dir)
	select {
	case err := <-written:
		t.Fatalf("a write went through a frozen filesystem (%v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	select {
	case err := <-written:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the filesystem is still frozen long after the freeze limit")
	}
	if hold.Ctx.Err() == nil {
		t.Error("the hold's context outlived the freeze: a copy could pass as consistent")
	}
	// The writer goes on at the thaw, a moment before the record goes;
	// Release returns once the thaw at the limit is done, record and all.
	hold.Release()
	if _, err := os.Stat(a.freezeRecordPath("vol")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("freeze record after the thaw: %v", err)
	}
}

func rwxVolume(rwx bool) []client.Object {
	if !rwx {
		return nil
	}
	return []client.Object{&v1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "vol"}, Spec: v1.VolumeSpec{StorageCluster: "c",
		Size: resource.MustParse("64Mi"), AccessMode: v1.ReadWriteMany, VolumeMode: v1.VolumeModeFilesystem, FSType: "ext4"}}}
}

// killFrozenAgent runs TestFreezeHelperProcess in a mount namespace of its
// own until it has frozen the volume, then kills it.
func killFrozenAgent(t *testing.T, h freezeHelper) {
	t.Helper()
	b, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", os.Args[0], "-test.run=^TestFreezeHelperProcess$", "-test.v")
	cmd.Env = append(os.Environ(), freezeHelperEnv+"="+string(b))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Skipf("unshare: %v", err)
	}
	frozen := make(chan bool, 1)
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			t.Logf("agent: %s", s.Text())
			if s.Text() == "frozen" {
				frozen <- true
			}
		}
		frozen <- false
	}()
	select {
	case ok := <-frozen:
		if !ok {
			_ = cmd.Wait()
			t.Fatal("the agent ended without freezing")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not freeze")
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
}

// writeAsync writes a file in dir and says when it is done.
func writeAsync(dir string) <-chan error {
	done := make(chan error, 1)
	go func() { done <- os.WriteFile(filepath.Join(dir, "after-freeze"), []byte("x"), 0o644) }()
	return done
}

// thawOnFailure thaws the filesystem at dir when the test ends, so that a
// failure leaves no frozen filesystem (and no writer stuck) behind.
func thawOnFailure(t *testing.T, dir string) {
	t.Cleanup(func() {
		f, err := os.Open(dir)
		if err != nil {
			return
		}
		defer f.Close()
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), 0xC0045878, 0); errno == 0 {
			t.Error("the filesystem was still frozen at the end")
		} else if !strings.Contains(errno.Error(), "invalid") {
			t.Logf("thaw at the end: %v", errno)
		}
	})
}
