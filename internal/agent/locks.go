package agent

import (
	"context"
	"fmt"
	"sync"
)

// VolumeLocks serializes work on one volume: stage, unstage, publish,
// unpublish, expand and healing. A second call on a busy volume is not
// queued but refused (ErrBusy), as the CSI spec's "operation pending"
// (Aborted) asks; kubelet retries it.
type VolumeLocks struct {
	mu sync.Mutex
	// held maps a locked volume to a channel closed when it is unlocked.
	held map[string]chan struct{}
}

// NewVolumeLocks returns an empty lock set.
func NewVolumeLocks() *VolumeLocks {
	return &VolumeLocks{held: map[string]chan struct{}{}}
}

// Lock waits for the lock of volume as long as it takes and returns the
// unlock function. Background work should use LockContext: an operation
// stuck on a dead device would make it wait forever.
func (l *VolumeLocks) Lock(volume string) func() {
	unlock, _ := l.LockContext(context.Background(), volume)
	return unlock
}

// LockContext waits for the lock of volume until ctx ends; then it gives
// up with an error wrapping ErrBusy. Background work (cleanup, healing)
// waits a bounded time where a CSI call would be refused at once, and
// retries later.
func (l *VolumeLocks) LockContext(ctx context.Context, volume string) (func(), error) {
	for {
		l.mu.Lock()
		freed, busy := l.held[volume]
		if !busy {
			l.held[volume] = make(chan struct{})
			l.mu.Unlock()
			return func() { l.Unlock(volume) }, nil
		}
		l.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return nil, fmt.Errorf("volume %s: %w: another operation holds it (%w)", volume, ErrBusy, context.Cause(ctx))
		}
	}
}

// TryLock takes the lock of volume, or reports that it is held.
func (l *VolumeLocks) TryLock(volume string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, busy := l.held[volume]; busy {
		return false
	}
	l.held[volume] = make(chan struct{})
	return true
}

// Unlock releases the lock of volume.
func (l *VolumeLocks) Unlock(volume string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if freed, ok := l.held[volume]; ok {
		close(freed)
		delete(l.held, volume)
	}
}
