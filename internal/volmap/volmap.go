// Package volmap holds Map, a map by volume ID that goroutines share: the
// agent's per-volume servers and reports, and the controllers' record of
// what they handled per volume.
package volmap

import "sync"

// Map is a map by volume ID that goroutines share. The zero value is
// ready to use.
type Map[V any] struct {
	mu   sync.Mutex
	byID map[string]V
}

// Put sets volume's value.
func (m *Map[V]) Put(volume string, v V) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byID == nil {
		m.byID = map[string]V{}
	}
	m.byID[volume] = v
}

// Get returns volume's value (the zero value if none).
func (m *Map[V]) Get(volume string) V {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.byID[volume]
}

// Take removes volume's value and returns it (the zero value if none).
func (m *Map[V]) Take(volume string) V {
	m.mu.Lock()
	defer m.mu.Unlock()
	v := m.byID[volume]
	delete(m.byID, volume)
	return v
}
