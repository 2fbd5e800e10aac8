package share

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/berth-io/berth/internal/share/sharetest"
)

// TestProbeAgainstRealGanesha probes a real ganesha export in each minor
// version: 4.1 and 4.2 with COMMIT over a session, 4.0 through the
// library client.
func TestProbeAgainstRealGanesha(t *testing.T) {
	g := sharetest.Start(t, 0, 1, 2)
	for _, minor := range []int{2, 1, 0} {
		res, err := ProbeConfig{Endpoint: g.Endpoint, Size: 600<<10 + 1, Timeout: 30 * time.Second, MinorVersion: minor, Log: testr.New(t)}.Run(context.Background())
		if err != nil {
			t.Fatalf("probe in NFSv4.%d: %v", minor, err)
		}
		if _, err := os.Stat(filepath.Join(g.Dir, res.File)); !os.IsNotExist(err) {
			t.Errorf("NFSv4.%d probe left %s behind: %v", minor, res.File, err)
		}
		t.Logf("NFSv4.%d: %d bytes in %s", minor, res.Bytes, res.Took)
	}
}
