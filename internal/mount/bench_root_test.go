package mount

import (
	"testing"

	"github.com/go-logr/logr"
)

// BenchmarkRootStagePublishCycle measures one pod's node-side life on an
// attached, already formatted loop device: stage, publish, unpublish,
// unstage (mount, fsck-free ext4 mount, bind, unmounts, /proc scans).
func BenchmarkRootStagePublishCycle(b *testing.B) {
	e := newRootEnv(b)
	e.mgr.log = logr.Discard()
	dev := e.attach(b, e.image(b, "vol", 64*mib))
	staging, target := e.path("staging"), e.path("pod/mount")
	stage := StageRequest{Device: dev, StagingPath: staging}
	if err := e.mgr.Stage(e.ctx, stage); err != nil { // formats once
		b.Fatal(err)
	}
	e.unstage(b, staging)
	b.ResetTimer()
	for b.Loop() {
		if err := e.mgr.Stage(e.ctx, stage); err != nil {
			b.Fatal(err)
		}
		if err := e.mgr.Publish(e.ctx, PublishRequest{StagingPath: staging, TargetPath: target}); err != nil {
			b.Fatal(err)
		}
		if err := e.mgr.Unpublish(e.ctx, target); err != nil {
			b.Fatal(err)
		}
		e.unstage(b, staging)
	}
}

// BenchmarkRootAttachDetach measures losetup attach (with the find that
// makes it idempotent) and detach.
func BenchmarkRootAttachDetach(b *testing.B) {
	e := newRootEnv(b)
	img := e.image(b, "vol", 64*mib)
	for b.Loop() {
		dev := e.attach(b, img)
		if err := e.loop.Detach(e.ctx, dev); err != nil {
			b.Fatal(err)
		}
	}
}
