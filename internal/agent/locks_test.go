package agent

import (
	"sync"
	"sync/atomic"
	"testing"
)

func TestVolumeLocksExclusive(t *testing.T) {
	l := NewVolumeLocks()
	if !l.TryLock("a") {
		t.Fatal("first lock refused")
	}
	if l.TryLock("a") {
		t.Fatal("second lock of a held volume granted")
	}
	if !l.TryLock("b") {
		t.Fatal("another volume's lock refused")
	}
	l.Unlock("a")
	if !l.TryLock("a") {
		t.Fatal("lock refused after unlock")
	}
}

// TestVolumeLocksNeverInterleave: of many concurrent callers on one volume,
// never two are inside at once.
func TestVolumeLocksNeverInterleave(t *testing.T) {
	l := NewVolumeLocks()
	var inside, maxInside, granted atomic.Int32
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				if !l.TryLock("v") {
					continue
				}
				granted.Add(1)
				n := inside.Add(1)
				for {
					m := maxInside.Load()
					if n <= m || maxInside.CompareAndSwap(m, n) {
						break
					}
				}
				inside.Add(-1)
				l.Unlock("v")
			}
		}()
	}
	wg.Wait()
	if maxInside.Load() != 1 || granted.Load() == 0 {
		t.Fatalf("max inside %d (want 1), granted %d", maxInside.Load(), granted.Load())
	}
}
