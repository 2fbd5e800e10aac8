package agent

import "sync"

// volumeMap is a map by volume ID that goroutines share.
type volumeMap[V any] struct {
	mu   sync.Mutex
	byID map[string]V
}

func (m *volumeMap[V]) put(volume string, v V) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byID == nil {
		m.byID = map[string]V{}
	}
	m.byID[volume] = v
}

func (m *volumeMap[V]) get(volume string) V {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.byID[volume]
}

// take removes volume's value and returns it (the zero value if none).
func (m *volumeMap[V]) take(volume string) V {
	m.mu.Lock()
	defer m.mu.Unlock()
	v := m.byID[volume]
	delete(m.byID, volume)
	return v
}
