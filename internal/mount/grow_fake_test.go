package mount

import (
	"testing"

	testingexec "k8s.io/utils/exec/testing"
)

// TestFakeGrowAtStageNeedsCleanCheck: a device larger than its ext4 grows
// before the mount only after e2fsck passes (exit 1, "repaired", passes);
// exit 4 (errors left) fails the stage with nothing resized or mounted.
func TestFakeGrowAtStageNeedsCleanCheck(t *testing.T) {
	for name, exit := range map[string]int{"repaired": 1, "errors left": 4} {
		t.Run(name, func(t *testing.T) {
			script := []testingexec.FakeCommandAction{
				cmd(t, "blkid", []string{"-p", "/dev/loop7"}, "DEVNAME=/dev/loop7\nTYPE=ext4\n", nil),
				cmd(t, "dumpe2fs", []string{"-h", "/dev/loop7"}, "Block count:              16384\nBlock size:               4096\n", nil),
				cmd(t, "blockdev", []string{"--getsize64", "/dev/loop7"}, "134217728\n", nil),
				cmd(t, "e2fsck", []string{"-f", "-p", "/dev/loop7"}, "", &testingexec.FakeExitError{Status: exit}),
			}
			if exit == 1 {
				script = append(script, cmd(t, "resize2fs", []string{"/dev/loop7"}, "", nil),
					// mount-utils' own probe and check before it mounts.
					cmd(t, "blkid", nil, "DEVNAME=/dev/loop7\nTYPE=ext4\n", nil),
					cmd(t, "fsck", []string{"/dev/loop7"}, "", nil))
			}
			f := newFakeEnv(t, script...)
			err := f.mgr.Stage(t.Context(), StageRequest{VolumeID: "v", Device: "/dev/loop7", StagingPath: f.path("staging")})
			if exit == 1 {
				if err != nil || f.exec.CommandCalls != len(script) || f.mounts() != 1 {
					t.Fatalf("stage: %v, %d commands, %d mounts; want grown and mounted", err, f.exec.CommandCalls, f.mounts())
				}
				return
			}
			if err == nil || f.exec.CommandCalls != len(script) || f.mounts() != 0 {
				t.Fatalf("stage: %v, %d commands, %d mounts; want a failure after e2fsck, nothing resized or mounted", err, f.exec.CommandCalls, f.mounts())
			}
		})
	}
}
