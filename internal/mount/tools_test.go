package mount

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/utils/exec"
	testingexec "k8s.io/utils/exec/testing"
)

// TestToolsKillAtDeadline runs real processes: a tool past its deadline is
// killed and reported as ErrToolTimeout, never as an exit code (blkid's 2
// would read as "blank"); one that ends in time keeps its exit code.
func TestToolsKillAtDeadline(t *testing.T) {
	tools := NewTools(exec.New(), Timeouts{Probe: 300 * time.Millisecond, KillGrace: time.Second})
	out, err := tools.Bind(context.Background()).CommandContext(context.Background(), "sh", "-c", "exit 2").CombinedOutput()
	var ee exec.ExitError
	if !errors.As(err, &ee) || ee.ExitStatus() != 2 {
		t.Fatalf("exit 2 came back as %v (%q)", err, out)
	}
	if _, ok := err.(exec.ExitError); !ok {
		t.Fatalf("exit error wrapped (%T): mount-utils reads it by type assertion", err)
	}
	// The bound is chosen by the tool's name: sh stands in for blkid.
	slow := NewTools(shellAs{exec.New()}, Timeouts{Probe: 300 * time.Millisecond, KillGrace: time.Second})
	start := time.Now()
	_, err = slow.Command("blkid", "-c", "sleep 30; exit 2").CombinedOutput()
	took := time.Since(start)
	if !errors.Is(err, ErrToolTimeout) {
		t.Fatalf("slow blkid: %v, want ErrToolTimeout", err)
	}
	if _, ok := err.(exec.ExitError); ok {
		t.Fatal("a killed tool came back as an exit code")
	}
	if took > 5*time.Second {
		t.Fatalf("slow blkid returned after %s", took)
	}
	// The caller's context ends the tool too.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start = time.Now()
	if err := slow.Bind(ctx).Command("mkfs.ext4", "-c", "sleep 30").Run(); !errors.Is(err, ErrToolTimeout) || time.Since(start) > 5*time.Second {
		t.Fatalf("mkfs under a cancelled context: %v after %s", err, time.Since(start))
	}
}

// shellAs runs every command as sh (the test's stand-in tools).
type shellAs struct{ exec.Interface }

func (s shellAs) CommandContext(ctx context.Context, _ string, args ...string) exec.Cmd {
	return s.Interface.CommandContext(ctx, "sh", args...)
}

// TestToolsReturnWhileStuck: a tool that cannot exit after the kill (in
// uninterruptible I/O; faked here by a command that never returns) still
// gives its caller an answer at deadline + grace.
func TestToolsReturnWhileStuck(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	fe := &testingexec.FakeExec{CommandScript: []testingexec.FakeCommandAction{
		func(cmd string, args ...string) exec.Cmd {
			fc := &testingexec.FakeCmd{CombinedOutputScript: []testingexec.FakeAction{
				func() ([]byte, []byte, error) { <-release; return nil, nil, nil },
			}}
			return testingexec.InitFakeCmd(fc, cmd, args...)
		},
	}}
	tools := NewTools(fe, Timeouts{Format: 100 * time.Millisecond, KillGrace: 100 * time.Millisecond})
	start := time.Now()
	_, err := tools.Command("mkfs.ext4", "/dev/loop9").CombinedOutput()
	if !errors.Is(err, ErrToolTimeout) {
		t.Fatalf("stuck mkfs: %v, want ErrToolTimeout", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("stuck mkfs returned after %s", took)
	}
}

func TestTimeoutsByTool(t *testing.T) {
	tt := Timeouts{Probe: 1, Format: 2, Check: 3, Resize: 4, Loop: 5, Mount: 7, Other: 6}.withDefaults()
	for cmd, want := range map[string]time.Duration{
		"blkid": 1, "blockdev": 1, "mkfs.ext4": 2, "mkfs.xfs": 2, "fsck": 3, "resize2fs": 4,
		"xfs_growfs": 4, "losetup": 5, "mount": 7, "umount": 7, "sh": 6,
	} {
		if got := tt.of(cmd); got != want {
			t.Errorf("%s: %v, want %v", cmd, got, want)
		}
	}
	if d := (Timeouts{}).withDefaults(); d != DefaultTimeouts() {
		t.Errorf("zero timeouts = %+v, want the defaults", d)
	}
}
