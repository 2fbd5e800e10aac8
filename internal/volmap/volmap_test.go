package volmap

import "testing"

func TestMap(t *testing.T) {
	var m Map[int]
	if got := m.Get("v"); got != 0 {
		t.Fatalf("empty Get = %d", got)
	}
	m.Put("v", 3)
	if got := m.Get("v"); got != 3 {
		t.Fatalf("Get = %d, want 3", got)
	}
	if got := m.Take("v"); got != 3 {
		t.Fatalf("Take = %d, want 3", got)
	}
	if got := m.Get("v"); got != 0 {
		t.Fatalf("Get after Take = %d, want 0", got)
	}
}
