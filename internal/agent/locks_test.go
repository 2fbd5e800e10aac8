package agent

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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

// TestLockContextBounded: a waiter gives up with ErrBusy when its context
// ends, and one that waits gets the lock as soon as it is freed.
func TestLockContextBounded(t *testing.T) {
	l := NewVolumeLocks()
	unlock := l.Lock("v")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := l.LockContext(ctx, "v"); !errors.Is(err, ErrBusy) {
		t.Fatalf("lock of a held volume: %v, want ErrBusy", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("gave up after %s", took)
	}
	got := make(chan func(), 1)
	go func() {
		u, err := l.LockContext(context.Background(), "v")
		if err != nil {
			t.Error(err)
		}
		got <- u
	}()
	select {
	case <-got:
		t.Fatal("lock granted while held")
	case <-time.After(50 * time.Millisecond):
	}
	unlock()
	select {
	case u := <-got:
		u()
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not woken by unlock")
	}
	if !l.TryLock("v") {
		t.Fatal("lock not free after the waiter's unlock")
	}
}
