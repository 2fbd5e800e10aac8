package agent

import "sync"

// VolumeLocks serializes work on one volume: stage, unstage, publish,
// unpublish, expand and healing. A second call on a busy volume is not
// queued but refused (ErrBusy), as the CSI spec's "operation pending"
// (Aborted) asks; kubelet retries it.
type VolumeLocks struct {
	mu   sync.Mutex
	held map[string]struct{}
}

// NewVolumeLocks returns an empty lock set.
func NewVolumeLocks() *VolumeLocks {
	return &VolumeLocks{held: map[string]struct{}{}}
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
}
