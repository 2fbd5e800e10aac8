package nbd

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/berth-io/berth/internal/blockdev/blockdevtest"
)

// BenchmarkServe4kRandRead: 4 KiB random reads at queue depth 64 over a
// socketpair from a real (page-cached) image; reports IOPS.
func BenchmarkServe4kRandRead(b *testing.B) {
	const size, qd, bs = 64 << 20, 64, 4096
	img, _ := blockdevtest.ImageFile(b, size, false)
	s := startServe(b, img, DefaultWorkers)
	fill := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(fill)) {
		if _, err := img.WriteAt(fill, off); err != nil {
			b.Fatal(err)
		}
	}
	var left atomic.Int64
	left.Store(int64(b.N))
	b.SetBytes(bs)
	b.ResetTimer()
	var wg sync.WaitGroup
	for q := range qd {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(q), 1))
			for left.Add(-1) >= 0 {
				off := uint64(rng.IntN(size/bs)) * bs
				errno, _, err := s.client.do(cmdRead, 0, off, bs, nil)
				if err != nil || errno != 0 {
					b.Errorf("read at %d: errno %d, %v", off, errno, err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "IOPS")
}
