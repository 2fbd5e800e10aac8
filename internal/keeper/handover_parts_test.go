package keeper

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestSplitParts: whatever the volumes, each part carries at most
// maxPartFDs fds (the listener's included), fits a reader's buffer, and
// the parts hold every volume once, in order, the last marked.
func TestSplitParts(t *testing.T) {
	big := json.RawMessage(`"` + strings.Repeat("x", maxMessage-200) + `"`)
	for _, tc := range []struct {
		name    string
		n       int
		server  func(i int) bool
		setting func(i int) json.RawMessage
		parts   int
	}{
		{"none", 0, nil, nil, 1},
		{"150 with servers", 150, func(int) bool { return true }, nil, 2},
		{"199 without", 199, func(int) bool { return false }, nil, 1},
		{"200 without", 200, func(int) bool { return false }, nil, 2},
		{"large settings", 5, func(i int) bool { return i%2 == 0 }, func(int) json.RawMessage { return big }, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var vols []handedVolume
			for i := range tc.n {
				v := handedVolume{Name: fmt.Sprintf("pvc-%04d", i), Mountpoint: fmt.Sprintf("/var/lib/berth/fuse/pvc-%04d", i)}
				if tc.server != nil && tc.server(i) {
					v.Server, v.ServerPID = true, int32(1000+i)
				}
				if tc.setting != nil {
					v.Settings = tc.setting(i)
				}
				vols = append(vols, v)
			}
			parts := splitParts(vols)
			if len(parts) != tc.parts {
				t.Errorf("%d parts, want %d", len(parts), tc.parts)
			}
			next := 0
			for i, p := range parts {
				b, _ := json.Marshal(p)
				fds := p.fds()
				if !p.Last {
					fds++ // the slot kept for the listener
				}
				if fds > maxPartFDs || len(b) > maxPart || p.Last != (i == len(parts)-1) || p.Total != tc.n {
					t.Fatalf("part %d: %d fds, %d bytes, last %v, total %d", i, p.fds(), len(b), p.Last, p.Total)
				}
				if _, err := decodePart(b, p.fds()); err != nil {
					t.Fatalf("part %d does not decode: %v", i, err)
				}
				for _, v := range p.Held {
					if v.Name != vols[next].Name {
						t.Fatalf("part %d holds %s, want %s", i, v.Name, vols[next].Name)
					}
					next++
				}
			}
			if next != tc.n {
				t.Fatalf("parts hold %d volumes, want %d", next, tc.n)
			}
		})
	}
}
