package nbd

import (
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// memBackend is an in-memory Backend that counts syncs and can fail or
// hold requests.
type memBackend struct {
	mu       sync.Mutex
	data     []byte
	syncs    atomic.Int32
	writeErr error         // returned by WriteAt when set
	hold     chan struct{} // WriteAt waits on it when set
	started  chan struct{} // gets a value as each held WriteAt starts
	noFalloc bool          // Fallocate answers EOPNOTSUPP
}

func newMemBackend(size int) *memBackend { return &memBackend{data: make([]byte, size)} }

func (m *memBackend) ReadAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return copy(p, m.data[off:]), nil
}

func (m *memBackend) WriteAt(p []byte, off int64) (int, error) {
	if m.hold != nil {
		m.started <- struct{}{}
		<-m.hold
	}
	if m.writeErr != nil {
		return 0, m.writeErr
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return copy(m.data[off:], p), nil
}

func (m *memBackend) Sync() error {
	m.syncs.Add(1)
	return nil
}

func (m *memBackend) Fallocate(mode uint32, off, length int64) error {
	if m.noFalloc {
		return unix.EOPNOTSUPP
	}
	if mode&(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_ZERO_RANGE) != 0 {
		m.mu.Lock()
		clear(m.data[off : off+length])
		m.mu.Unlock()
	}
	return nil
}

func (m *memBackend) Size() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int64(len(m.data))
}
