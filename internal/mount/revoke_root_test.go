package mount

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestRootRevokePublishLeavesTombstone: a publish revoked under a running
// pod (a file held open through it) leaves an empty file of mode 0 where
// the folder was, so that a runtime's MkdirAll of the path fails instead of
// making a folder on the node's disk. Publishing again replaces it;
// Unpublish removes it; with the pod's folder gone, nothing is left.
func TestRootRevokePublishLeavesTombstone(t *testing.T) {
	e := newRootEnv(t)
	req := e.stage(t, e.image(t, "vol", 64*mib), StageRequest{VolumeID: "v", FSType: "ext4"})
	target := e.path("pod/volumes/v/mount")
	pub := PublishRequest{VolumeID: "v", StagingPath: req.StagingPath, TargetPath: target}
	if err := e.mgr.Publish(e.ctx, pub); err != nil {
		t.Fatal(err)
	}
	busy, err := os.Create(filepath.Join(target, "held"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = busy.Close() }()

	if err := e.mgr.RevokePublish(e.ctx, target); err != nil {
		t.Fatal(err)
	}
	if !isTombstone(target) {
		fi, err := os.Lstat(target)
		t.Fatalf("no tombstone at %s: %v %v", target, fi, err)
	}
	if mounted, err := e.mgr.IsMounted(e.ctx, target); err != nil || mounted {
		t.Fatalf("target still mounted (%t) after revoke: %v", mounted, err)
	}
	// What containerd's CRI does with a missing host path.
	if err := os.MkdirAll(target, 0o755); !errors.Is(err, syscall.ENOTDIR) {
		t.Fatalf("MkdirAll of a revoked target: want ENOTDIR, got %v", err)
	}
	// Revoked twice: the tombstone stays, nothing fails.
	if err := e.mgr.RevokePublish(e.ctx, target); err != nil || !isTombstone(target) {
		t.Fatalf("second revoke: %v, tombstone %t", err, isTombstone(target))
	}

	// Published again (the volume came back): a folder with the volume.
	if err := e.mgr.Publish(e.ctx, pub); err != nil {
		t.Fatalf("publish over a tombstone: %v", err)
	}
	if _, err := os.Stat(filepath.Join(target, "held")); err != nil {
		t.Fatalf("volume not shown after publishing again: %v", err)
	}
	if err := e.mgr.RevokePublish(e.ctx, target); err != nil {
		t.Fatal(err)
	}
	// The pod's deletion: Unpublish takes the tombstone away.
	if err := e.mgr.Unpublish(e.ctx, target); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("tombstone left after unpublish: %v", err)
	}

	// kubelet tore the pod's folder down already: no tombstone is made.
	gone := e.path("gone/volumes/v/mount")
	if err := e.mgr.RevokePublish(e.ctx, gone); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Dir(gone)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("revoke made %s: %v", filepath.Dir(gone), err)
	}

	// A file that is not a tombstone is never replaced by a publish.
	other := e.path("pod2/mount")
	if err := os.MkdirAll(filepath.Dir(other), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	pub.TargetPath = other
	if err := e.mgr.Publish(e.ctx, pub); err == nil {
		t.Fatal("publish over another file succeeded")
	}
	if _, err := os.Lstat(other); err != nil {
		t.Fatalf("the other file was removed: %v", err)
	}
}
