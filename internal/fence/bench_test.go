package fence_test

import (
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
)

// BenchmarkAcquireRelease measures one uncontended stage-record acquire plus
// its release (create, then delete of the Attachment) on the real API server.
func BenchmarkAcquireRelease(b *testing.B) {
	suite.Require(b)
	f := fence.New(env.Client, &record.FakeRecorder{}, clock.RealClock{}, logr.Discard(), fence.Options{})
	r := stageReq("vol-bench", "bench-node", v1.ReadWriteOnce)
	ctx := ctxT(b)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		if err := f.Acquire(ctx, r); err != nil {
			b.Fatal(err)
		}
		if err := f.Release(ctx, r.Volume, r.Node, r.MountDir); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
}
