package agent

import "sync"

// VolumeLocks serializes work on one volume: stage, unstage, publish,
// unpublish, expand and healing. A second call on a busy volume is not
// queued but refused (ErrBusy), as the CSI spec's "operation pending"
// (Aborted) asks; kubelet retries it.
type VolumeLocks struct {
	mu   sync.Mutex
	free *sync.Cond
	held map[string]struct{}
}

// NewVolumeLocks returns an empty lock set.
func NewVolumeLocks() *VolumeLocks {
	l := &VolumeLocks{held: map[string]struct{}{}}
	l.free = sync.NewCond(&l.mu)
	return l
}

// Lock waits for the lock of volume; background work (cleanup, healing)
// waits where a CSI call would be refused. It returns the unlock function.
func (l *VolumeLocks) Lock(volume string) func() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		if _, busy := l.held[volume]; !busy {
			break
		}
		l.free.Wait()
	}
	l.held[volume] = struct{}{}
	return func() { l.Unlock(volume) }
}

// TryLock takes the lock of volume, or reports that it is held.
func (l *VolumeLocks) TryLock(volume string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, busy := l.held[volume]; busy {
		return false
	}
	l.held[volume] = struct{}{}
	return true
}

// Unlock releases the lock of volume.
func (l *VolumeLocks) Unlock(volume string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.held, volume)
	l.free.Broadcast()
}
