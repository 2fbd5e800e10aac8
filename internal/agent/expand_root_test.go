package agent

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-io/berth/internal/mount"
)

// TestRootExpandWithoutCapabilitySaysNextStage: where a mounted ext4 cannot
// grow (no CAP_SYS_RESOURCE), Expand answers ErrUnsupported (the CSI
// boundary's FailedPrecondition) naming the next stage, not a failure to
// retry; unstaging and staging again grows it.
func TestRootExpandWithoutCapabilitySaysNextStage(t *testing.T) {
	e := newQuiesceEnv(t)
	ctx := t.Context()
	staging := filepath.Join(t.TempDir(), "staging")
	req := mount.StageRequest{VolumeID: "vol", Device: e.dev, StagingPath: staging}
	if err := e.mounts.Stage(ctx, req); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = e.mounts.Unstage(context.Background(), staging) })
	if _, err := e.images.Expand(ctx, "vol", 128<<20); err != nil {
		t.Fatal(err)
	}
	_, err := e.agent.Expand(ctx, "vol", staging, false)
	if err == nil {
		t.Skip("ext4 grew online: this process has CAP_SYS_RESOURCE")
	}
	if !errors.Is(err, ErrUnsupported) || !errors.Is(err, mount.ErrGrowsAtStage) || !strings.Contains(err.Error(), "staged") {
		t.Fatalf("Expand err = %v, want ErrUnsupported saying it grows at the next stage", err)
	}
	if _, err := e.mounts.Unstage(ctx, staging); err != nil {
		t.Fatal(err)
	}
	if err := e.mounts.Stage(ctx, req); err != nil {
		t.Fatal(err)
	}
	st, err := e.mounts.Stats(ctx, staging)
	if err != nil {
		t.Fatal(err)
	}
	if st.TotalBytes < 100<<20 {
		t.Fatalf("staged again: %d MiB, want about 128", st.TotalBytes>>20)
	}
}

// TestRootGrowShareDevice: the device an RWX volume's share manager holds
// (staged here as a block device) grows to the image's new size; at that
// size already, it is left as it is.
func TestRootGrowShareDevice(t *testing.T) {
	e := newRWXQuiesceEnv(t)
	ctx := t.Context()
	e.stage(t, true)
	if size, err := e.agent.GrowShareDevice(ctx, "vol"); err != nil || size != 64<<20 {
		t.Fatalf("at the image's size: %d, %v", size, err)
	}
	if _, err := e.images.Expand(ctx, "vol", 96<<20); err != nil {
		t.Fatal(err)
	}
	if size, err := e.agent.GrowShareDevice(ctx, "vol"); err != nil || size != 96<<20 {
		t.Fatalf("after the image grew: %d, %v", size, err)
	}
	if size, err := mount.DeviceSize(e.dev); err != nil || size != 96<<20 {
		t.Errorf("device %s is %d bytes (%v), want 96 MiB", e.dev, size, err)
	}
}
