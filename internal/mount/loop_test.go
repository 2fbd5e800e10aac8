package mount

import (
	"errors"
	"testing"

	testingexec "k8s.io/utils/exec/testing"

	"github.com/berth-io/berth/internal/volerr"
)

func isErr(err, target error) bool { return errors.Is(err, target) }

func TestLoopAttachReusesExisting(t *testing.T) {
	fe := &testingexec.FakeExec{CommandScript: []testingexec.FakeCommandAction{
		cmd(t, "losetup", []string{"--associated", "/img"}, "/dev/loop3     0\n", nil),
	}}
	dev, err := NewLoop(fe).Attach(t.Context(), "/img", false)
	if err != nil || dev != "/dev/loop3" || fe.CommandCalls != 1 {
		t.Fatalf("got %q %v after %d commands", dev, err, fe.CommandCalls)
	}
}

func TestLoopAttachNew(t *testing.T) {
	fe := &testingexec.FakeExec{CommandScript: []testingexec.FakeCommandAction{
		cmd(t, "losetup", []string{"--associated"}, "", nil),
		cmd(t, "losetup", []string{"--find", "--show", "--direct-io=on", "--read-only", "/img"},
			"losetup: /img: failed to set direct io\n/dev/loop4\n", nil),
	}}
	dev, err := NewLoop(fe).Attach(t.Context(), "/img", true)
	if err != nil || dev != "/dev/loop4" {
		t.Fatalf("got %q %v", dev, err)
	}
}

func TestLoopAttachModeMismatch(t *testing.T) {
	fe := &testingexec.FakeExec{CommandScript: []testingexec.FakeCommandAction{
		cmd(t, "losetup", nil, "/dev/loop3     1\n", nil),
	}}
	if _, err := NewLoop(fe).Attach(t.Context(), "/img", false); !isErr(err, ErrExists) {
		t.Fatalf("read-only device for a writer: want ErrExists, got %v", err)
	}
}

func TestLoopDetachIdempotent(t *testing.T) {
	fe := &testingexec.FakeExec{CommandScript: []testingexec.FakeCommandAction{
		cmd(t, "losetup", []string{"--detach", "/dev/loop3"}, "losetup: /dev/loop3: detach failed: No such device or address\n", &testingexec.FakeExitError{Status: 1}),
		cmd(t, "losetup", []string{"--detach", "/dev/loop3"}, "losetup: /dev/loop3: detach failed: Permission denied\n", &testingexec.FakeExitError{Status: 1}),
	}}
	l := NewLoop(fe)
	if err := l.Detach(t.Context(), "/dev/loop3"); err != nil {
		t.Fatalf("free device: %v", err)
	}
	if err := l.Detach(t.Context(), "/dev/loop3"); err == nil {
		t.Fatal("real failure hidden")
	}
	if err := l.Detach(t.Context(), ""); !isErr(err, volerr.ErrInvalid) {
		t.Fatalf("empty: %v", err)
	}
}
