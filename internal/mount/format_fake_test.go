package mount

import (
	"errors"
	"testing"

	testingexec "k8s.io/utils/exec/testing"
)

// TestFakeStageSecondProbeCannotFormat: Stage's probe finds ext4, then
// mount-utils' own probe fails as "nothing found": the gate refuses its
// mkfs, and nothing is mounted.
func TestFakeStageSecondProbeCannotFormat(t *testing.T) {
	f := newFakeEnv(t,
		cmd(t, "blkid", []string{"-p", "/dev/loop7"}, "DEVNAME=/dev/loop7\nTYPE=ext4\n", nil),
		// Full size: nothing to grow before the mount.
		cmd(t, "dumpe2fs", []string{"/dev/loop7"}, "Block count:              16384\nBlock size:               4096\n", nil),
		cmd(t, "blockdev", []string{"--getsize64", "/dev/loop7"}, "67108864\n", nil),
		cmd(t, "blkid", nil, "", &testingexec.FakeExitError{Status: 2}),
		cmd(t, "mkfs.ext4", nil, "", nil),
	)
	err := f.mgr.Stage(t.Context(), StageRequest{VolumeID: "v", Device: "/dev/loop7", StagingPath: f.path("staging")})
	if err == nil {
		t.Fatal("stage succeeded")
	}
	if f.exec.CommandCalls != 4 || f.mounts() != 0 {
		t.Fatalf("%d commands, %d mounts; want two probes and the size check, no mkfs, no mount", f.exec.CommandCalls, f.mounts())
	}
}

// TestFakeStageNeverFormat: with Format.Never, "nothing found" fails with
// ErrHoldsData and runs nothing more; a failing blkid fails as well.
func TestFakeStageNeverFormat(t *testing.T) {
	for name, exit := range map[string]int{"nothing found": 2, "blkid fails": 4} {
		t.Run(name, func(t *testing.T) {
			f := newFakeEnv(t,
				cmd(t, "blkid", nil, "", &testingexec.FakeExitError{Status: exit}),
				cmd(t, "blkid", nil, "", &testingexec.FakeExitError{Status: 2}),
				cmd(t, "mkfs.ext4", nil, "", nil),
			)
			err := f.mgr.Stage(t.Context(), StageRequest{VolumeID: "v", Device: "/dev/loop7", StagingPath: f.path("staging"),
				Format: FormatPolicy{Never: true, Why: "it is a copy"}})
			if err == nil || (exit == 2) != errors.Is(err, ErrHoldsData) {
				t.Fatalf("stage: %v", err)
			}
			if f.exec.CommandCalls != 1 || f.mounts() != 0 {
				t.Fatalf("%d commands, %d mounts; want one probe only", f.exec.CommandCalls, f.mounts())
			}
		})
	}
}
