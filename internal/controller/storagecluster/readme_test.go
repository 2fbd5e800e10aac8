package storagecluster_test

import (
	"os"
	"strings"
	"testing"

	"github.com/berth-io/berth/internal/controller/storagecluster"
)

// TestReadmeNamesTheScrapeServices: the README's metrics table names the
// Services the operator makes (TestNodeWideObjects sees them in the API
// server), not per-cluster ones that do not exist.
func TestReadmeNamesTheScrapeServices(t *testing.T) {
	b, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	for _, component := range []string{"agent", "csi-controller"} {
		if name := storagecluster.ObjectName(component) + "-metrics"; !strings.Contains(readme, "`"+name+"`") {
			t.Errorf("README does not name the scrape Service %s", name)
		}
	}
	for _, stale := range []string{"<cluster>-agent-metrics", "<cluster>-csi-controller-metrics", "Not built yet"} {
		if strings.Contains(readme, stale) {
			t.Errorf("README still says %q", stale)
		}
	}
}
