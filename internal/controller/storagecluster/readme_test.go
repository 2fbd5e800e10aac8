package storagecluster_test

import (
	"os"
	"strings"
	"testing"

	"github.com/berth-io/berth/internal/controller/storagecluster"
)

// TestReadmeNamesTheScrapeServices: the metrics table of the documentation
// (docs/metrics.md, linked from the README) names the Services the operator
// makes (TestNodeWideObjects sees them in the API server), not per-cluster
// ones that do not exist.
func TestReadmeNamesTheScrapeServices(t *testing.T) {
	b, err := os.ReadFile("../../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, component := range []string{"agent", "csi-controller"} {
		if name := storagecluster.ObjectName(component) + "-metrics"; !strings.Contains(doc, "`"+name+"`") {
			t.Errorf("docs/metrics.md does not name the scrape Service %s", name)
		}
	}
	for _, stale := range []string{"<cluster>-agent-metrics", "<cluster>-csi-controller-metrics", "Not built yet"} {
		if strings.Contains(doc, stale) {
			t.Errorf("docs/metrics.md still says %q", stale)
		}
	}
}
