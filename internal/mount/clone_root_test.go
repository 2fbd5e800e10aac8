package mount

import (
	"os"
	"path/filepath"
	"testing"

	"k8s.io/utils/exec"
)

// TestRootXFSCloneStagesBesideSource: a clone or restore is a byte copy of
// its source, XFS UUID included; both stage on one node at once. Without
// nouuid the second mount fails with "Filesystem has duplicate UUID".
func TestRootXFSCloneStagesBesideSource(t *testing.T) {
	e := newRootEnv(t)
	src := e.image(t, "source", 320*mib)
	srcReq := e.stage(t, src, StageRequest{VolumeID: "source", StagingPath: e.path("source-staging"), FSType: "xfs", Format: FormatPolicy{Image: src}})
	srcDev, srcStaging := srcReq.Device, srcReq.StagingPath
	if err := os.WriteFile(filepath.Join(srcStaging, "hello"), []byte("world"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.unstage(t, srcStaging)

	clone := filepath.Join(e.dir, "clone.img")
	if out, err := exec.New().Command("cp", "--sparse=always", src, clone).CombinedOutput(); err != nil {
		t.Fatalf("copy the image: %v %s", err, out)
	}
	cloneDev := e.attach(t, clone)
	cloneStaging := e.path("clone-staging")
	cloneReq := StageRequest{VolumeID: "clone", Device: cloneDev, StagingPath: cloneStaging, FSType: "xfs",
		Format: FormatPolicy{Never: true, Why: "it is a copy of a volume"}}

	if err := e.mgr.Stage(e.ctx, srcReq); err != nil {
		t.Fatalf("stage the source again: %v", err)
	}
	if err := e.mgr.Stage(e.ctx, cloneReq); err != nil {
		t.Fatalf("stage the clone beside its source: %v", err)
	}
	for dev, staging := range map[string]string{srcDev: srcStaging, cloneDev: cloneStaging} {
		if n := mountsOf(t, dev); n != 1 {
			t.Fatalf("%s: %d mounts, want 1", dev, n)
		}
		if got, err := os.ReadFile(filepath.Join(staging, "hello")); err != nil || string(got) != "world" {
			t.Fatalf("read through %s: %q %v", staging, got, err)
		}
	}
	// The two are separate filesystems: a write to the clone stays there.
	if err := os.WriteFile(filepath.Join(cloneStaging, "only-clone"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(srcStaging, "only-clone")); !os.IsNotExist(err) {
		t.Fatalf("clone's file seen in the source: %v", err)
	}
	for _, staging := range []string{cloneStaging, srcStaging} {
		e.unstage(t, staging)
	}
}
